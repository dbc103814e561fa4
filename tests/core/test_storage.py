"""Object storage against real servers on loopback: moto's S3 server (a subprocess) and small HTTP servers in threads."""

from __future__ import annotations

import http.server
import multiprocessing
import pickle
import socket
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor

import pytest
from conftest import S3_KEY_ID, S3_SECRET, s3_authentication

import crackseg.core.storage as storage
from crackseg.core.errors import InputError
from crackseg.core.storage import HTTP_ATTEMPTS, RemoteFile, StorageError, create_if_absent, delete_file, gdal_options, gdal_path, list_files, list_keys, upload_file
from crackseg.core.urls import display_url, is_url

SUFFIXES = (".jpg", ".png")


def _safe_one_line(error: Exception, url: str) -> str:
    """The error's text, after checking that it is one line naming the URL as shown and holding no credential."""
    text = str(error)
    assert "\n" not in text and text.startswith(display_url(url) + ": ")
    assert S3_KEY_ID not in text and S3_SECRET not in text and "X-Amz" not in text
    return text


def test_display_url_leaves_out_credentials_and_the_query():
    presigned = ("https://user:pass@bucket.example.com/photos/a%20b.jpg?X-Amz-Credential=AKIAX%2F20260101%2Fus-east-1"
                 "&X-Amz-Signature=abc123#frag")
    assert display_url(presigned) == "https://bucket.example.com/photos/a%20b.jpg"
    assert display_url("s3://survey/photos/what?.jpg") == "s3://survey/photos/what?.jpg"  # a key may hold ?
    assert display_url("photos/a.jpg") == "photos/a.jpg"
    assert [is_url(text) for text in ("s3://b/k", "https://h/p", "gs://b/k", "photos/a.jpg", "C:\\photos")] == [True, True, True, False, False]
    file = RemoteFile(presigned)
    assert str(file) == repr(file)[12:-2] == display_url(presigned) and file.name == "a b.jpg" and file.stem == "a b"


def test_a_prefix_lists_images_as_a_folder_does(s3):
    for key in ("photos/a.jpg", "photos/b.png", "photos/notes.txt", "photos/sub/c.jpg", "photosets/d.jpg"):
        s3.put(key, key.encode())
    flat = [(str(file), name) for file, name in list_files(s3.url("photos/"), SUFFIXES)]
    assert flat == [(s3.url("photos/a.jpg"), "a"), (s3.url("photos/b.png"), "b")]
    assert [(str(f), n) for f, n in list_files(s3.url("photos"), SUFFIXES)] == flat  # a prefix named without its /
    deep = [name for _, name in list_files(s3.url("photos/"), SUFFIXES, recursive=True)]
    assert deep == ["a", "b", "sub/c"]
    assert [name for _, name in list_files(s3.url(), SUFFIXES, recursive=True)] == ["photos/a", "photos/b", "photos/sub/c", "photosets/d"]
    assert [name for _, name in list_files(s3.url("photo*/*.jpg"), SUFFIXES)] == ["a", "d"]
    assert [(str(f), n) for f, n in list_files(s3.url("photos/notes.txt"), SUFFIXES)] == [(s3.url("photos/notes.txt"), "notes")]


def test_keys_and_prefixes_holding_glob_characters_are_taken_as_they_are(s3):
    for key in ("q/a?.jpg", "q/ab.jpg", "b/[x]6.jpg", "survey [2024]/p.jpg", "survey [2024]/sub/r.jpg"):
        s3.put(key, key.encode())
    assert [str(f) for f, _ in list_files(s3.url("q/a?.jpg"), SUFFIXES)] == [s3.url("q/a?.jpg")]
    assert [str(f) for f, _ in list_files(s3.url("b/[x]6.jpg"), SUFFIXES)] == [s3.url("b/[x]6.jpg")]
    assert [name for _, name in list_files(s3.url("survey [2024]/"), SUFFIXES)] == ["p"]
    assert [name for _, name in list_files(s3.url("survey [2024]"), SUFFIXES, recursive=True)] == ["p", "sub/r"]
    assert [name for _, name in list_files(s3.url("q/a*.jpg"), SUFFIXES)] == ["a?", "ab"]  # a pattern still matches


def test_a_key_that_would_leave_the_output_folder_is_refused(s3):
    s3.put("photos/../../etc/x.jpg", b"x")
    with pytest.raises(StorageError, match=r"'\.\.' part cannot name an output file"):
        list_files(s3.url("photos/"), SUFFIXES, recursive=True)


def test_files_pickle_into_forked_workers_which_read_them(s3):
    """As DataLoader workers: forked after this process listed and read, each opens its own connection."""
    url = s3.put("photos/a.jpg", b"photo bytes")
    file, _ = list_files(url, SUFFIXES)[0]
    assert file.read_bytes() == b"photo bytes"
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as workers:
        assert workers.submit(pickle.loads(pickle.dumps(file)).read_bytes).result(timeout=60) == b"photo bytes"


@pytest.mark.parametrize("case", ["bucket", "recursive", "key", "read", "prefix"])
def test_missing_bucket_key_or_prefix_is_one_line(s3, case):
    s3.put("photos/a.jpg", b"x")
    url = {"bucket": "s3://crackseg-no-such-bucket/photos/", "recursive": "s3://crackseg-no-such-bucket/",
           "key": s3.url("photos/none.jpg"), "read": s3.url("photos/none.jpg"), "prefix": s3.url("none/")}[case]
    with pytest.raises(StorageError) as caught:
        RemoteFile(url).read_bytes() if case == "read" else list_files(url, SUFFIXES, recursive=case == "recursive")
    reason = "no such bucket 'crackseg-no-such-bucket'" if case in ("bucket", "recursive") else "not found"
    assert _safe_one_line(caught.value, url).endswith(reason)


def test_a_wrong_endpoint_is_one_line_after_bounded_retries(s3, monkeypatch):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    with pytest.raises(StorageError) as caught:
        list_files(s3.url("photos/"), SUFFIXES)
    assert f"cannot connect to http://127.0.0.1:{port}" in _safe_one_line(caught.value, s3.url("photos/"))


def test_refused_credentials_are_one_line_without_them(s3):
    url = s3.put("photos/a.jpg", b"x")
    with s3_authentication(s3.endpoint), pytest.raises(StorageError) as caught:
        list_files(s3.url("photos/"), SUFFIXES)
    assert "does not know the access key id" in _safe_one_line(caught.value, s3.url("photos/"))
    with s3_authentication(s3.endpoint), pytest.raises(StorageError) as caught:
        RemoteFile(url).read_bytes()
    assert "does not know the access key id" in _safe_one_line(caught.value, url)


def test_a_presigned_url_is_read_and_shown_without_its_signature(s3):
    s3.put("photos/my photo.jpg", b"signed bytes")
    url = s3.presigned("photos/my photo.jpg")
    assert "X-Amz-Signature" in url and S3_KEY_ID in url
    (file, name), = list_files(url, SUFFIXES)
    assert file.read_bytes() == b"signed bytes" and name == "my photo"
    assert str(file) == f"{s3.endpoint}/{s3.name}/photos/my%20photo.jpg"


def test_http_files_and_their_errors(http_folder):
    folder, base = http_folder
    (folder / "a.jpg").write_bytes(b"served")
    assert RemoteFile(base + "a.jpg").read_bytes() == b"served"
    with pytest.raises(StorageError) as caught:
        list_files(base + "none.jpg", SUFFIXES)
    assert _safe_one_line(caught.value, base + "none.jpg").endswith("not found (HTTP 404)")
    with pytest.raises(StorageError, match=r"^gs://b/k: gs:// is not supported"):
        list_files("gs://b/k", SUFFIXES)


class _Flaky(http.server.BaseHTTPRequestHandler):
    """Answers GET with ``status`` for the first ``failures`` requests, then with the body; counts the requests."""

    status = 503
    failures = 0
    requests = 0

    def do_GET(self):
        type(self).requests += 1
        status, body = (self.status, b"no") if type(self).requests <= type(self).failures else (200, b"at last")
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def flaky():
    """(the handler class, to set ``failures`` and read ``requests``; the server's base URL)."""
    handler = type("Flaky", (_Flaky,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield handler, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("scheme", ["s3", "http"])
def test_transient_errors_are_retried_a_bounded_number_of_times(s3, flaky, monkeypatch, scheme):
    """s3:// by botocore's standard retry mode (AWS_MAX_ATTEMPTS), http(s):// HTTP_ATTEMPTS times, with backoff."""
    handler, endpoint = flaky
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    url = s3.url("photo.jpg") if scheme == "s3" else f"{endpoint}/photo.jpg"
    attempts = 2 if scheme == "s3" else HTTP_ATTEMPTS
    handler.failures = attempts - 1
    assert RemoteFile(url).read_bytes() == b"at last" and handler.requests == attempts
    handler.failures, handler.requests = 100, 0
    with pytest.raises(StorageError) as caught:
        RemoteFile(url).read_bytes()
    assert handler.requests == attempts and "503" in _safe_one_line(caught.value, url)


@pytest.fixture
def silent():
    """(a list of the connections made, a base URL): a server that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    connections = []

    def accept():
        while True:
            try:
                connections.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield connections, f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()
    for connection in connections:
        connection.close()


@pytest.mark.parametrize("scheme", ["s3", "http"])
@pytest.mark.parametrize("request_kind", ["check", "head", "whole", "list"])
def test_a_server_that_never_answers_gets_three_attempts_of_one_timeout(s3, silent, monkeypatch, scheme, request_kind):
    """Each request made of several (HEAD, then GET) or repeated by s3fs over botocore's own attempts is still the
    documented number of attempts, each bounded by one read timeout."""
    import s3fs

    connections, endpoint = silent
    monkeypatch.setitem(storage.HTTP_TIMEOUTS_S, "sock_read", 0.5)
    monkeypatch.setitem(storage._BOTOCORE_CONFIG, "read_timeout", 0.5)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")
    s3fs.S3FileSystem.clear_instance_cache()
    url = s3.url("photos/a.jpg") if scheme == "s3" else f"{endpoint}/photos/a.jpg"
    act = {"check": lambda: RemoteFile(url).check_readable(), "head": lambda: RemoteFile(url).read_head(65536),
           "whole": lambda: RemoteFile(url).read_bytes(), "list": lambda: list_files(url, SUFFIXES)}[request_kind]
    started = time.monotonic()
    with pytest.raises(StorageError) as caught:
        act()
    assert "timed out" in _safe_one_line(caught.value, url) and len(connections) == 3
    # attempts, their jittered backoffs at most, and slack for a loaded machine: far below one default 60 s timeout
    assert time.monotonic() - started < 3 * 0.5 + (1 + 2) + 15


def test_a_refused_http_request_is_not_retried(flaky):
    """As an expired presigned URL: 403 will not change by asking again."""
    handler, endpoint = flaky
    handler.status, handler.failures = 403, 100
    url = f"{endpoint}/photo.jpg?X-Amz-Credential={S3_KEY_ID}%2F20260101&X-Amz-Signature=abc"
    with pytest.raises(StorageError) as caught:
        RemoteFile(url).read_bytes()
    assert handler.requests == 1
    assert _safe_one_line(caught.value, url) == f"{endpoint}/photo.jpg: access denied (HTTP 403; a presigned URL may have expired)"


def test_keys_are_written_whole_created_only_if_absent_listed_and_deleted(s3, tmp_path):
    (tmp_path / "mask.png").write_bytes(b"mask")
    upload_file(tmp_path / "mask.png", s3.url("pred/masks/a.png"))
    assert create_if_absent(s3.url("pred/.lock"), b"mine") and not create_if_absent(s3.url("pred/.lock"), b"theirs")
    assert RemoteFile(s3.url("pred/.lock")).read_bytes() == b"mine"
    assert list_keys(s3.url("pred/")) == [".lock", "masks/a.png"] and list_keys(s3.url("none/")) == []
    delete_file(s3.url("pred/.lock"))
    delete_file(s3.url("pred/.lock"))  # gone already: no error
    assert list_keys(s3.url("pred")) == ["masks/a.png"]
    with pytest.raises(StorageError) as missing:
        list_keys("s3://crackseg-no-such-bucket/pred/")
    assert _safe_one_line(missing.value, "s3://crackseg-no-such-bucket/pred/").endswith("no such bucket 'crackseg-no-such-bucket'")


def test_a_multipart_upload_that_fails_leaves_no_object_and_no_parts(s3, tmp_path, monkeypatch):
    """A connection dropped on the second of three 5 MiB parts: the upload is aborted, the key never appears."""
    import botocore.exceptions
    import s3fs

    monkeypatch.setattr(s3fs.core, "calculate_chunksize", lambda size, chunksize=None: 5 * 2**20)
    call = s3fs.S3FileSystem._call_s3

    async def dropped_on_part_2(self, method, *args, **kwargs):
        if method == "upload_part" and kwargs["PartNumber"] == 2:
            raise botocore.exceptions.ConnectionClosedError(endpoint_url=s3.endpoint)
        return await call(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", dropped_on_part_2)
    (tmp_path / "big.tif").write_bytes(bytes(11 * 2**20))
    url = s3.url("pred/masks/big.tif")
    with pytest.raises(StorageError) as failed:
        upload_file(tmp_path / "big.tif", url)
    assert _safe_one_line(failed.value, url) == f"{url}: cannot connect to {s3.endpoint}: check AWS_ENDPOINT_URL and the network"
    assert "Contents" not in s3.client.list_objects_v2(Bucket=s3.name)
    assert "Uploads" not in s3.client.list_multipart_uploads(Bucket=s3.name)


def test_without_the_extra_a_url_names_the_pip_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "s3fs", None)
    with pytest.raises(InputError, match=r"reading s3:// URLs needs s3fs; pip install 'crackseg\[s3\]'"):
        list_files("s3://survey/photos/", SUFFIXES)


def test_gdal_reads_the_store_as_s3fs_does():
    """GDAL ignores AWS_ENDPOINT_URL: its host, scheme and path-style requests become GDAL's options, and an option the
    environment sets itself is GDAL's to read there (a GDAL option set by rasterio.Env would override it)."""
    options = gdal_options({"AWS_ENDPOINT_URL": "http://user:pw@127.0.0.1:9000"})
    assert {k: options[k] for k in ("AWS_S3_ENDPOINT", "AWS_HTTPS", "AWS_VIRTUAL_HOSTING")} == {
        "AWS_S3_ENDPOINT": "127.0.0.1:9000", "AWS_HTTPS": "NO", "AWS_VIRTUAL_HOSTING": "FALSE"}
    assert "GDAL_DISABLE_READDIR_ON_OPEN" not in options and options["VSI_CACHE"] == "TRUE"  # a local raster's sidecars are read
    s3_only = gdal_options({"AWS_ENDPOINT_URL": "http://other:1", "AWS_ENDPOINT_URL_S3": "https://minio.example/",
                            "AWS_VIRTUAL_HOSTING": "TRUE", "GDAL_HTTP_MAX_RETRY": "9"})
    assert s3_only["AWS_S3_ENDPOINT"] == "minio.example" and s3_only["AWS_HTTPS"] == "YES"
    assert "AWS_VIRTUAL_HOSTING" not in s3_only and "GDAL_HTTP_MAX_RETRY" not in s3_only
    assert not {"AWS_S3_ENDPOINT", "AWS_HTTPS", "AWS_VIRTUAL_HOSTING"} & set(gdal_options({}))
    assert gdal_path("s3://bucket/a b/ortho.tif") == "/vsis3/bucket/a b/ortho.tif"
    assert gdal_path("https://host/ortho.tif?X-Amz-Signature=1") == "/vsicurl/https://host/ortho.tif?X-Amz-Signature=1"


@pytest.mark.parametrize("url", ["http://[::1/x.jpg", "s3://[bad/x.jpg", "https://host:99999/x.jpg", "http://host:8O/x.jpg"])
def test_a_url_that_does_not_parse_is_one_line_naming_it(url):
    with pytest.raises(StorageError, match=r"not a valid URL \(") as raised:
        storage.list_files(url, (".jpg",))
    assert str(raised.value).startswith(url.split("?")[0]) and "\n" not in str(raised.value)


def test_a_url_that_does_not_parse_is_shown_without_its_credentials():
    assert display_url("http://me:secret@[::1/x.jpg?X-Amz-Signature=s") == "http://[::1/x.jpg"
