"""Keys and tenancy: 401 without a key, 403 with a wrong one, a key sees only what it made,
quotas per key, and no key ever in a log line."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import aiohttp
import httpx
import pytest

import orchard_async as oa
from orchard_async.apps.serve.keys import KeyStore, hash_key, load_keys, new_key
from tests.service.conftest import KEY_A, KEY_B, Service, make_sandbox
from tests.service.test_contract import assert_json, exec_body


@pytest.fixture
async def keyed(start_service) -> Service:
    return await start_service(keys=True)


async def test_no_key_401_wrong_key_403_public_paths_open(keyed: Service) -> None:
    async with keyed.client() as anonymous, keyed.client("not-a-key") as wrong:
        assert assert_json(await anonymous.post("/sandboxes", json={"image": "x"}), 401)["reason"] == "no_key"
        assert assert_json(await wrong.post("/sandboxes", json={"image": "x"}), 403)["reason"] == "bad_key"
        assert_json(await anonymous.get("/jobs/x"), 401)
        assert_json(await wrong.get("/metrics"), 403)
        assert_json(await anonymous.get("/health"), 200)
        assert_json(await anonymous.get("/"), 200)
    async with httpx.AsyncClient(base_url=keyed.url, headers={"Authorization": f"Bearer {KEY_A}"}) as scraper:
        assert "orchard_serve_live_sandboxes" in (await scraper.get("/metrics")).text


async def test_a_key_sees_only_its_own_sandboxes_and_jobs(keyed: Service) -> None:
    async with keyed.client(KEY_A) as a, keyed.client(KEY_B) as b:
        mine = await make_sandbox(a, sandbox_id="shared-name")
        job = (await a.post(f"/sandboxes/{mine}/exec", json=exec_body("echo secret > s.txt; echo hi"))).json()
        for method, path, body in [
            ("GET", f"/sandboxes/{mine}", None),
            ("GET", f"/sandboxes/{mine}/wait", None),
            ("POST", f"/sandboxes/{mine}/exec", exec_body("rm s.txt")),
            ("GET", f"/sandboxes/{mine}/files?path=/workspace/s.txt", None),
            ("GET", f"/sandboxes/{mine}/files/list?path=/workspace", None),
            ("POST", f"/sandboxes/{mine}/apply_patch", {"patch": "", "timeout_seconds": 5}),
            ("POST", f"/sandboxes/{mine}/heartbeat", None),
            ("DELETE", f"/sandboxes/{mine}", None),
            ("GET", f"/jobs/{job['job_id']}", None),
        ]:
            assert_json(await b.request(method, path, json=body), 404)
        assert (await b.get("/sandboxes")).json()["sandboxes"] == []
        # The same name in another key's namespace is another sandbox.
        theirs = await make_sandbox(b, sandbox_id="shared-name")
        other = (await b.post(f"/sandboxes/{theirs}/exec", json=exec_body("cat s.txt"))).json()
        assert other["status"] == "failed"
        still = (await a.post(f"/sandboxes/{mine}/exec", json=exec_body("cat s.txt"))).json()
        assert still["stdout"] == "secret\n"


async def test_live_sandbox_quota(start_service) -> None:
    service = await start_service("sim", keys=True, quotas={"max_sandboxes": 2})
    async with service.client(KEY_A) as a, service.client(KEY_B) as b:
        made = [(await a.post("/sandboxes", json={"image": "x"})).json()["sandbox_id"] for _ in range(2)]
        over = await a.post("/sandboxes", json={"image": "x"})
        assert assert_json(over, 503)["reason"] == "quota_sandboxes" and over.headers["Retry-After"]
        assert (await b.post("/sandboxes", json={"image": "x"})).status_code == 200  # the other key's own quota
        await a.delete(f"/sandboxes/{made[0]}")
        assert (await a.post("/sandboxes", json={"image": "x"})).status_code == 200


async def test_creates_per_minute_quota(start_service) -> None:
    service = await start_service("sim", keys=True, quotas={"creates_per_minute": 2})
    async with service.client(KEY_A) as a:
        for _ in range(2):
            made = (await a.post("/sandboxes", json={"image": "x"})).json()
            await a.delete(f"/sandboxes/{made['sandbox_id']}")
        over = await a.post("/sandboxes", json={"image": "x"})
        assert assert_json(over, 503)["reason"] == "quota_rate"
        assert 1 <= int(over.headers["Retry-After"]) <= 60


async def test_keys_never_reach_the_log(keyed: Service, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with keyed.client(KEY_A) as a, keyed.client("wrong-key-xyz") as wrong:
        sandbox_id = await make_sandbox(a)
        await a.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body("echo hi"))
        await wrong.get("/sandboxes")
        async with aiohttp.ClientSession() as session:
            url = f"{keyed.url}/sandboxes/{sandbox_id}/exec/pty?api_key={KEY_A}"
            async with session.ws_connect(url) as ws:
                await ws.send_str("not json")
                await ws.receive(timeout=10)
    text = "\n".join(record.getMessage() for record in caplog.records)
    assert '"key": "team-a"' in text  # requests are logged, by the key's name
    for secret in (KEY_A, "wrong-key-xyz", hash_key(KEY_A)):
        assert secret not in text


def test_key_file_holds_hashes_and_is_checked(tmp_path: Path) -> None:
    key, entry = new_key("team-c")
    store = KeyStore(load_keys(write(tmp_path, {"keys": [json.loads(entry)]})))
    assert store.authenticate(key).name == "team-c"
    assert store.authenticate(key + "x") is None
    assert key not in entry
    for content, words in [
        ({"keys": [{"name": "a", "key": "plain"}]}, "never the key itself"),
        ({"keys": [{"name": "a", "sha256": "abc"}]}, "64 lowercase hex"),
        ({"keys": [{"name": "a b", "sha256": "0" * 64}]}, "letters, digits"),
        ({"keys": [{"name": "a", "sha256": "0" * 64}, {"name": "a", "sha256": "1" * 64}]}, "twice"),
        ({"keys": [{"name": "a", "sha256": "0" * 64, "max_sandboxes": 0}]}, "at least 1"),
        ({"keys": []}, "lists no key"),
        ({"tenants": []}, "expected"),
    ]:
        with pytest.raises(oa.ConfigError, match=words) as caught:
            load_keys(write(tmp_path, content))
        assert "\n" not in str(caught.value)
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(oa.ConfigError, match="--keys"):
        load_keys(tmp_path / "broken.json")
    with pytest.raises(oa.ConfigError, match="cannot read"):
        load_keys(tmp_path / "missing.json")


def write(tmp_path: Path, content: dict) -> Path:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(content))
    return path
