"""What a labelling config asks crackseg for, and where a task's image is."""

from __future__ import annotations

import numpy as np
import pytest

from crackseg.integrations.label_studio import ProtocolError, image_url, read_config

BRUSH = """<View><Image name="photo" value="$img" zoom="true"/>
  <BrushLabels name="tag" toName="photo"><Label value="Crack" background="red"/><Label value="spalling"/></BrushLabels></View>"""
POLYGON = """<View><Image name="image" value="$image"/>
  <PolygonLabels name="label" toName="image" strokeWidth="1"><Label value="defect"/></PolygonLabels></View>"""


def test_brush_config_names_results_and_picks_the_crack_label():
    target = read_config(BRUSH)
    assert (target.brush, target.from_name, target.to_name, target.data_key, target.label) == (True, "tag", "photo", "img", "Crack")
    mask = np.zeros((6, 8), bool)
    mask[2, 1:7] = True
    (result,) = target.results(mask)
    assert (result["type"], result["from_name"], result["to_name"]) == ("brushlabels", "tag", "photo")
    assert result["value"]["brushlabels"] == ["Crack"] and (result["original_width"], result["original_height"]) == (8, 6)


def test_polygon_config_with_one_label_takes_it():
    target = read_config(POLYGON)
    assert (target.brush, target.from_name, target.to_name, target.data_key, target.label) == (False, "label", "image", "image", "defect")
    mask = np.zeros((10, 20), bool)
    mask[3:5, 2:18] = True
    mask[8, 0:3] = True
    results = target.results(mask)
    assert len(results) == 2 and {r["type"] for r in results} == {"polygonlabels"}
    points = np.array(results[0]["value"]["points"])
    assert results[0]["value"]["polygonlabels"] == ["defect"] and points.min() >= 0 and points.max() <= 100


def test_brush_wins_over_polygons_in_one_config():
    both = POLYGON.replace("</View>", '<BrushLabels name="b" toName="image"><Label value="crack"/></BrushLabels></View>')
    assert read_config(both).brush and read_config(both).from_name == "b"


def test_the_tag_with_the_crack_label_answers_whichever_tag_comes_first():
    stains = '<View><Image name="image" value="$image"/><BrushLabels name="stains" toName="image"><Label value="efflorescence"/></BrushLabels>'
    later_brush = stains + '<BrushLabels name="cracks" toName="image"><Label value="crack"/></BrushLabels></View>'
    assert (read_config(later_brush).from_name, read_config(later_brush).label) == ("cracks", "crack")
    polygon = stains + '<PolygonLabels name="outline" toName="image"><Label value="Crack"/></PolygonLabels></View>'
    target = read_config(polygon)
    assert (target.brush, target.from_name, target.label) == (False, "outline", "Crack")
    with pytest.raises(ProtocolError, match="none of the labelling config's <BrushLabels name='stains'>, <PolygonLabels name='p'>"):
        read_config(stains + '<PolygonLabels name="p" toName="image"><Label value="rust"/></PolygonLabels></View>')
    riss = '<View><Image name="image" value="$image"/><BrushLabels name="b" toName="image"><Label value="Riss"/></BrushLabels>'
    riss += '<PolygonLabels name="p" toName="image"><Label value="Riss"/></PolygonLabels></View>'  # one label, in two tags
    assert (read_config(riss).brush, read_config(riss).label) == (True, "Riss")


@pytest.mark.parametrize("config, message", [
    ('<View><Image name="i" value="$i"/><RectangleLabels name="r" toName="i"><Label value="crack"/></RectangleLabels></View>',
     "no <BrushLabels> or <PolygonLabels>"),
    ('<View><Image name="i" value="$i"/><BrushLabels name="b" toName="i"><Label value="a"/><Label value="b"/></BrushLabels></View>',
     "needs a <Label value=\"crack\">"),
    ('<View><Image name="i" value="$i"/><BrushLabels name="b" toName="other"><Label value="crack"/></BrushLabels></View>',
     "must point at an <Image"),
    ("<View><Image", "not valid XML"),
    ("", "no labelling config"),
    (None, "no labelling config"),
])
def test_configs_crackseg_cannot_answer_are_one_line_errors(config, message):
    with pytest.raises(ProtocolError, match=message) as raised:
        read_config(config)
    assert "\n" not in str(raised.value)


def test_image_urls_label_studio_serves_are_joined_to_its_address():
    target = read_config(BRUSH)
    studio = "http://ls.example:8080/"
    assert image_url({"id": 1, "data": {"img": "/data/upload/1/ab12cd34-wall.png"}}, target, studio) == (
        "http://ls.example:8080/data/upload/1/ab12cd34-wall.png")
    assert image_url({"id": 2, "data": {"img": "/data/local-files/?d=photos/a%20b.jpg"}}, target, studio) == (
        "http://ls.example:8080/data/local-files/?d=photos/a%20b.jpg")
    assert image_url({"id": 4, "data": {"img": "https://cdn.example/x.png"}}, target, studio) == "https://cdn.example/x.png"
    with pytest.raises(ProtocolError, match="task 5: /data/upload/1/x.png is served by Label Studio; set LABEL_STUDIO_URL"):
        image_url({"id": 5, "data": {"img": "/data/upload/1/x.png"}}, target, None)
    with pytest.raises(ProtocolError, match="task 6: no image URL in data.img"):
        image_url({"id": 6, "data": {"image": "x.png"}}, target, studio)
    with pytest.raises(ProtocolError, match="cannot fetch 's3://bucket/x.png'"):
        image_url({"id": 7, "data": {"img": "s3://bucket/x.png"}}, target, studio)
    with pytest.raises(ProtocolError, match=r"task 8: 'http://\[::1/x.png' is not a URL"):
        image_url({"id": 8, "data": {"img": "http://[::1/x.png"}}, target, studio)
