"""Label Studio's ML-backend protocol without the server: what a project's labelling config asks for, where a task's
image is, and the pre-annotations of a mask.

The config's first ``<BrushLabels>`` (else ``<PolygonLabels>``) with a ``<Label>`` named crack (any case), else its
first such tag when all of them hold the same labels, decides the result type; its ``name`` and ``toName`` are the results' ``from_name`` and
``to_name``, the ``<Image>`` it points at names the task's data key, and its crack label (or its only label) is the
label given. Results are drawn as ``crackseg labels
export --format labelstudio`` draws them.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urljoin, urlparse
from xml.etree import ElementTree

import numpy as np

from crackseg.labels.formats.label_studio import labelstudio_results
from crackseg.labels.formats.outlines import CRACK

RESULT_TAGS = {"BrushLabels": True, "PolygonLabels": False}  # tag -> results as a brush (else polygons)
SERVED_PATHS = ("/data/", "/storage-data/", "/tasks/")  # image URLs Label Studio serves itself, behind its token


class ProtocolError(ValueError):
    """A request Label Studio's protocol does not allow, or a config crackseg cannot answer: one line for the caller."""


@dataclass(frozen=True)
class Target:
    """What a project's labelling config asks crackseg for."""

    brush: bool
    from_name: str
    to_name: str
    data_key: str  # the task's data field holding the image URL
    label: str

    def results(self, mask: np.ndarray) -> list[dict]:
        return labelstudio_results(mask, self.brush, (self.from_name, self.to_name), self.label)


def read_config(config: str) -> Target:
    """The target of a labelling config (XML text)."""
    if not isinstance(config, str) or not config.strip():
        raise ProtocolError("no labelling config: the request needs label_config (or the project's schema)")
    try:
        root = ElementTree.fromstring(config)
    except ElementTree.ParseError as error:
        raise ProtocolError(f"the labelling config is not valid XML: {error}") from None
    tags = [tag for kind in RESULT_TAGS for tag in root.iter(kind)]
    if not tags:
        raise ProtocolError(f"the labelling config has no {' or '.join(f'<{kind}>' for kind in RESULT_TAGS)} for crack masks")
    named = [tag for tag in tags if CRACK in _labels(tag, str.lower)]
    if not named and len({tuple(_labels(tag)) for tag in tags}) > 1:  # tags of other labels: which one is crack's, a guess
        shown = ", ".join(f"<{tag.tag} name={tag.get('name')!r}>" for tag in tags)
        raise ProtocolError(f"none of the labelling config's {shown} has a <Label value=\"{CRACK}\">")
    tag = (named or tags)[0]
    from_name, to_name = tag.get("name"), tag.get("toName")
    image = next((found for found in root.iter("Image") if found.get("name") == to_name), None)
    if not from_name or image is None or not (image.get("value") or "").startswith("$"):
        raise ProtocolError(f"<{tag.tag} name={from_name!r} toName={to_name!r}> must point at an <Image value=\"$field\">")
    return Target(RESULT_TAGS[tag.tag], from_name, to_name, image.get("value")[1:], _crack_label(tag))


def _labels(tag: ElementTree.Element, case=str) -> list[str]:
    return [case(label.get("value")) for label in tag.iter("Label") if label.get("value")]


def _crack_label(tag: ElementTree.Element) -> str:
    values = _labels(tag)
    chosen = [value for value in values if value.lower() == CRACK] or (values if len(values) == 1 else [])
    if not chosen:
        raise ProtocolError(f"<{tag.tag} name={tag.get('name')!r}> needs a <Label value=\"{CRACK}\">, has {values or 'none'}")
    return chosen[0]


def image_url(task: dict, target: Target, label_studio_url: str | None) -> str:
    """The absolute URL of the task's image (:mod:`crackseg.integrations.fetching` decides whether it may be fetched,
    and with which credentials)."""
    if not isinstance(task, dict) or not isinstance(task.get("data"), dict):
        raise ProtocolError("a task without a data object")
    url = task["data"].get(target.data_key)
    if not isinstance(url, str) or not url:
        raise ProtocolError(f"task {task.get('id')}: no image URL in data.{target.data_key}")
    try:
        parsed = urlparse(url)
    except ValueError as error:  # a bracket left open
        raise ProtocolError(f"task {task.get('id')}: {url[:200]!r} is not a URL ({error})") from None
    if parsed.scheme in ("http", "https"):
        return url
    if not parsed.scheme and url.startswith(SERVED_PATHS):
        if not label_studio_url:
            raise ProtocolError(f"task {task.get('id')}: {url} is served by Label Studio; set LABEL_STUDIO_URL (and LABEL_STUDIO_API_KEY)")
        return urljoin(label_studio_url.rstrip("/") + "/", url.lstrip("/"))
    raise ProtocolError(f"task {task.get('id')}: cannot fetch {url[:200]!r}; crackseg reads http(s) URLs and Label Studio's /data/ paths")
