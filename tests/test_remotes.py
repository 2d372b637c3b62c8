"""The registry of remote servers (engine/remotes.py) and the secret store (engine/secret_store.py): every
refusal (bad names and addresses, credentials in a URL, duplicates, too many, damaged files), the secrets
file's 0600 mode, and the keyring path turned off or failing."""

from __future__ import annotations

import json
import os

import pytest

from engine import remotes, secret_store
from engine.api import RemoteError, RemoteRegistry, SecretError, SecretStore, read_secret_file, split_model_key
from engine.remotes import check_base_url, check_name

KEY = "sk-registry-key-123"


@pytest.fixture
def registry(tmp_path) -> RemoteRegistry:
    return RemoteRegistry(tmp_path)


@pytest.mark.parametrize("name", ["", "Lab", "-lab", "a b", "lab/x", "x" * 33, "ü", ".."[:1] + "/"])
def test_bad_names(name):
    with pytest.raises(RemoteError, match="cannot name a server"):
        check_name(name)


@pytest.mark.parametrize("url, why", [
    ("gpu-box:8000", "not a server address"), ("ftp://h", "not a server address"), ("http://", "not a server address"),
    ("http://h/?k=v", "query or fragment"), ("http://h/#x", "query or fragment"),
    ("http://user:pw@h:1", "--api-key-file"), ("http://" + "h" * 3000, "longer than"),
])
def test_bad_addresses(url, why):
    with pytest.raises(RemoteError, match=why):
        check_base_url(url)


@pytest.mark.parametrize("url", ["ftp://user:SECRET123@h", "http://h/?key=SECRET123", "gopher://h/#SECRET123"])
def test_a_refused_address_that_may_hold_a_key_is_not_quoted(url):
    with pytest.raises(RemoteError) as caught:
        check_base_url(url)
    assert "SECRET123" not in str(caught.value)


def test_addresses_are_kept_as_the_apis_root():
    assert check_base_url(" http://h:8000/v1/ ") == "http://h:8000"
    assert check_base_url("https://h/proxy/v1") == "https://h/proxy"
    assert split_model_key("lab/meta-llama/Llama-3.1-70B") == ("lab", "meta-llama/Llama-3.1-70B")
    assert split_model_key("tiny") is None and split_model_key("lab/") is None and split_model_key("/m") is None
    assert split_model_key("/abs/path.gguf") is None and split_model_key("Lab/m") is None


def test_add_find_replace_remove(registry, tmp_path):
    server = registry.add("lab", "http://h:8000/v1", KEY)
    assert (server.name, server.base_url, server.has_key) == ("lab", "http://h:8000", True)
    assert registry.find("lab/llama") == (server, "llama") and registry.find("other/llama") is None
    assert registry.api_key("lab") == KEY and server.model_key("m") == "lab/m"
    assert KEY not in (tmp_path / "remotes.json").read_text()  # the key is never in the list
    with pytest.raises(RemoteError, match="exists already"):
        registry.add("lab", "http://other:1")
    replaced = registry.add("lab", "http://other:1", replace=True)
    assert not replaced.has_key and registry.api_key("lab") is None  # replaced without a key: its key is gone
    registry.remove("lab")
    assert registry.servers() == []
    with pytest.raises(RemoteError, match="no remote server named 'lab' \\(servers: none yet\\)"):
        registry.remove("lab")


def test_a_refused_key_adds_nothing(registry):
    with pytest.raises(SecretError, match="spaces"):
        registry.add("lab", "http://h:1", "two words")
    assert registry.servers() == []


def test_at_most_so_many_servers(registry, monkeypatch):
    monkeypatch.setattr(remotes, "MAX_SERVERS", 3)
    for i in range(3):
        registry.add(f"s{i}", "http://h:1")
    with pytest.raises(RemoteError, match="at most 3 servers"):
        registry.add("s3", "http://h:1")
    registry.add("s0", "http://h:2", replace=True)  # replacing one is not one more


@pytest.mark.parametrize("content", [b"not json", b"[1]", b'{"servers": []}', b'{"servers": {"Bad": "http://h"}}',
                                     b'{"servers": {"x": "ftp://h"}}', b"\xff\xfe", b" " * (remotes.MAX_FILE_BYTES + 1)])
def test_a_damaged_list_is_said_plainly(registry, content):
    registry.path.write_bytes(content)
    with pytest.raises(RemoteError, match="is damaged"):
        registry.servers()


def test_an_unreadable_list(registry):
    registry.path.mkdir()  # a directory where the file should be
    with pytest.raises(RemoteError, match="cannot read the list of remote servers"):
        registry.servers()


def test_the_secrets_file_is_private_and_bounded(tmp_path):
    store = SecretStore(tmp_path, use_keyring=False)
    assert store.where == str(tmp_path / "secrets.json")
    store.set("server", "lab", KEY)
    path = tmp_path / "secrets.json"
    assert path.stat().st_mode & 0o777 == 0o600
    os.chmod(path, 0o644)  # widened by someone: reading narrows it again
    assert store.get("server", "lab") == KEY and path.stat().st_mode & 0o777 == 0o600
    store.delete("server", "lab")
    assert store.get("server", "lab") is None and json.loads(path.read_text()) == {}
    for bad in (b"{", b'{"a": 1}', b"[]"):
        path.write_bytes(bad)
        with pytest.raises(SecretError, match="damaged"):
            store.get("server", "lab")
    path.write_bytes(b" " * (secret_store.MAX_FILE_BYTES + 1))
    with pytest.raises(SecretError, match="larger than 1 MB"):
        store.get("server", "lab")


@pytest.mark.parametrize("value, why", [("", "is empty"), ("  \n", "is empty"), ("a b", "spaces"),
                                        ("a\x00b", "control"), ("k" * 5000, "longer than")])
def test_keys_that_cannot_be_keys(tmp_path, value, why):
    with pytest.raises(SecretError, match=why) as refused:
        SecretStore(tmp_path, use_keyring=False).set("server", "lab", value)
    assert not value.strip() or value not in str(refused.value)  # a refused key is not echoed


def test_key_files(tmp_path):
    good = tmp_path / "k"
    good.write_text(f"  {KEY}\n")
    assert read_secret_file(good, "the key") == KEY
    with pytest.raises(SecretError, match="cannot read the key from"):
        read_secret_file(tmp_path / "missing", "the key")
    (tmp_path / "bin").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(SecretError, match="is not text"):
        read_secret_file(tmp_path / "bin", "the key")
    (tmp_path / "big").write_text("k" * 10000)
    with pytest.raises(SecretError, match="longer than"):
        read_secret_file(tmp_path / "big", "the key")
    with pytest.raises(SecretError, match="cannot read"):
        read_secret_file(tmp_path, "the key")  # a directory


class FakeKeyring:
    """A keyring backend that works, or fails, as the system's may (a locked store)."""

    priority = 1

    def __init__(self, fail: bool = False):
        self.fail, self.items = fail, {}

    def get_password(self, service, entry):
        if self.fail:
            raise RuntimeError("locked")
        return self.items.get((service, entry))

    def set_password(self, service, entry, value):
        if self.fail:
            raise RuntimeError("locked")
        self.items[(service, entry)] = value

    def delete_password(self, service, entry):
        if self.fail:
            raise RuntimeError("locked")
        self.items.pop((service, entry), None)


def test_the_keyring_path_and_its_fallback(tmp_path, monkeypatch, caplog):
    assert secret_store._system_keyring() is None  # HEARTH_KEYRING=0 in the tests: the file
    ring = FakeKeyring()
    monkeypatch.setattr(secret_store, "_system_keyring", lambda: ring)
    store = SecretStore(tmp_path)
    assert store.where == "the system keyring"
    store.set("server", "lab", KEY)
    assert ring.items[("hearth", "server:lab")] == KEY and not (tmp_path / "secrets.json").exists()
    assert store.get("server", "lab") == KEY
    store.delete("server", "lab")
    assert ring.items == {}
    ring.fail = True  # a locked keyring: the file keeps it, and the log says so without the key
    store.set("server", "lab", KEY)
    assert store.get("server", "lab") == KEY and KEY in (tmp_path / "secrets.json").read_text()
    assert "keyring refused" in caplog.text and KEY not in caplog.text
