"""`orchard-async images build` (orchard_async/images/build.py): image specs as data, what gets
built for which names, one-line errors, and a real build where a Docker daemon answers."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from pathlib import Path

import pytest

import orchard_async as oa
from orchard_async import ConfigError
from orchard_async.images import build as images
from orchard_async.images.build import ImageSpec, build_images
from tests.conftest import backend_missing

# -- specs and names ----------------------------------------------------------------------------


def test_image_specs_are_checked_data() -> None:
    spec = ImageSpec(tag="orchard/x:1", base="debian-minbase", apt_packages=("python3", "git"))
    assert spec.base_tag == "orchard/bookworm:min" and spec.suite == "bookworm"
    assert ImageSpec(tag="orchard/x:1", base="debian-minbase").base_tag is None  # a base itself
    assert ImageSpec(tag="orchard/x:1", base="busybox").base_tag is None
    assert spec.digest == ImageSpec(tag="orchard/x:1", base="debian-minbase", apt_packages=("python3", "git")).digest
    assert spec.digest != ImageSpec(tag="orchard/x:1", base="debian-minbase", apt_packages=("python3",)).digest
    for bad, match in (
        ({"tag": "Orchard/X", "base": "busybox"}, "lower-case"),
        ({"tag": "a:b", "base": "alpine"}, "busybox' or 'debian-minbase"),
        ({"tag": "a:b", "base": "busybox", "apt_packages": ("git",)}, "busybox has no apt"),
        ({"tag": "a:b", "base": "debian-minbase", "apt_packages": ("git; rm -rf /",)}, "not a Debian package"),
        ({"tag": "a:b", "base": "debian-minbase", "suite": "../x"}, "not a Debian release"),
    ):
        with pytest.raises(ConfigError, match=match):
            ImageSpec(**bad)


def test_pip_packages_come_as_wheels_for_the_images_python(tmp_path: Path) -> None:
    from orchard_async.images import wheels as image_wheels

    plain = ImageSpec(tag="orchard/x:1", base="debian-minbase", apt_packages=("python3",))
    assert plain.digest == "80dd0969fd59ed06"  # as before pip_packages existed: no rebuild of such images
    with pytest.raises(ConfigError, match="need 'python3-pip'"):
        ImageSpec(tag="orchard/x:1", base="debian-minbase", apt_packages=("python3",), pip_packages=("a",))
    piped = ImageSpec(
        tag="orchard/x:1", base="debian-minbase", apt_packages=("python3", "python3-pip"), pip_packages=("a==1",)
    )
    assert piped.digest != ImageSpec(**{**msgspec_fields(piped), "pip_packages": ("a==2",)}).digest
    tags = image_wheels.platforms(36, "x86_64")
    assert tags[0] == "manylinux_2_36_x86_64" and "manylinux_2_17_x86_64" in tags and "manylinux2014_x86_64" in tags
    assert "manylinux_2_37_x86_64" not in tags  # nothing newer than the image's glibc
    lines = image_wheels.dockerfile_lines(("mini-swe-agent==2.4.6",))
    assert "COPY wheels /tmp/wheels" in lines and "--no-index --find-links /tmp/wheels" in lines
    with pytest.raises(image_wheels.WheelDownloadFailed, match="no known python3 for Debian sid"):
        image_wheels.download(("a",), "sid", tmp_path / "w", log=tmp_path / "log")


def msgspec_fields(spec: ImageSpec) -> dict:
    import msgspec

    return msgspec.structs.asdict(spec)


def test_the_recipes_declare_their_images_and_the_test_images_stay_buildable() -> None:
    declared = [spec.tag for name in oa.recipe_names() for spec in getattr(oa.load_recipe(name), "IMAGES", [])]
    recipe_tags = [spec.tag for spec in images.recipe_images()]
    assert recipe_tags == list(dict.fromkeys(declared))  # each once, in the recipes' order (toy needs none)
    assert {"orchard/swe-python:bookworm", "orchard/claw-python:bookworm", "orchard/gui-chromium:bookworm"} <= set(
        recipe_tags
    )
    known = images.known_images()
    assert {"orchard/busybox:test", "orchard/python:test", "orchard/bookworm:min", *recipe_tags} <= set(known)
    assert images.build_command(recipe_tags[0]) == "orchard-async images build"
    assert images.build_command("orchard/busybox:test") == "orchard-async images build orchard/busybox:test"
    assert images.build_command("orchard/python:test", "kubernetes") == (
        "orchard-async images build orchard/python:test --adapter kubernetes"
    )
    assert images.build_command("library/debian:12") is None


def test_apt_mirror_from_deb822_then_one_line_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    assert images.apt_mirror("bookworm", str(tmp_path)) == images.DEFAULT_MIRROR
    (tmp_path / "sources.list").write_text("# comment\ndeb [arch=amd64] http://one.example/debian bookworm main\n")
    assert images.apt_mirror("bookworm", str(tmp_path)) == "http://one.example/debian"
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\n\n"
        "Types: deb\nURIs: http://mirror.example/debian http://second.example/debian\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n"
    )
    assert images.apt_mirror("bookworm", str(tmp_path)) == "http://mirror.example/debian"
    assert images.apt_mirror("trixie", str(tmp_path)) == images.DEFAULT_MIRROR


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("orchard-async images: "), err
    return err


@pytest.mark.parametrize(
    ("names", "adapter", "match"),
    [
        (["orchard/nope:1"], "docker", "unknown image orchard/nope:1; known: "),
        (None, "local", "for the docker or kubernetes adapter, not 'local'"),
    ],
)
def test_bad_requests_are_one_line_and_exit_2(capsys, names, adapter, match) -> None:
    assert build_images(names, adapter=adapter) == 2
    assert match in one_line_error(capsys)


def test_kubernetes_without_a_local_containerd_is_unsupported_in_one_line(capsys, monkeypatch) -> None:
    monkeypatch.setattr(images, "containerd_address", lambda: None)
    assert build_images(["orchard/busybox:test"], adapter="kubernetes") == 2
    assert "needs a registry, which is unsupported" in one_line_error(capsys)


def test_without_the_docker_cli_it_says_what_to_install(capsys, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker here
    assert build_images(["orchard/busybox:test"]) == 2
    assert "the docker CLI is not installed: install Docker" in one_line_error(capsys)


def test_without_a_daemon_it_says_to_start_one(capsys, monkeypatch, tmp_path: Path) -> None:
    if images.shutil.which("docker") is None:
        pytest.skip("the docker CLI is not installed (that case is the test above)")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")
    assert build_images(["orchard/busybox:test"]) == 2
    assert "no Docker daemon answers" in one_line_error(capsys)


def test_without_debootstrap_it_says_what_to_install(monkeypatch, tmp_path: Path) -> None:
    real_which = images.shutil.which
    monkeypatch.setattr(images.shutil, "which", lambda name: None if name == "debootstrap" else real_which(name))
    monkeypatch.setattr(images.os, "access", lambda path, mode: False)
    builder = images.Builder(force=False, state=tmp_path)
    with pytest.raises(images.ImageBuildError, match=r"needs debootstrap: apt-get install debootstrap$"):
        builder._minbase(ImageSpec(tag="orchard/trixie:min", base="debian-minbase", suite="trixie"))


def test_module_entry_point_adds_the_test_images(monkeypatch) -> None:
    calls: list[tuple] = []
    monkeypatch.setattr(images, "build_images", lambda names, **kw: calls.append((names, kw)) or 0)
    recipe_tags = [spec.tag for spec in images.recipe_images()]
    test_tags = [spec.tag for spec in [*images.TEST_IMAGES, *images.ADAPTER_IMAGES]]  # the egress filter's too
    assert images.main(["build"]) == 0
    assert images.main(["build", "--test", "--force"]) == 0
    assert images.main(["build", "orchard/busybox:test", "--adapter", "kubernetes"]) == 0
    assert calls == [
        (None, {"adapter": "docker", "force": False}),
        (recipe_tags + test_tags, {"adapter": "docker", "force": True}),
        (["orchard/busybox:test"], {"adapter": "kubernetes", "force": False}),
    ]


# -- a real build -------------------------------------------------------------------------------------


def docker_answers() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_build_skip_and_rebuild_on_a_changed_spec(capsys, monkeypatch, tmp_path: Path) -> None:
    """A busybox image (seconds to build): built, then skipped while its spec is the same,
    rebuilt when the spec changes; then runnable as a sandbox image."""
    if not docker_answers():
        backend_missing("docker: no daemon answers `docker info`")
    if not images._is_static_elf("/bin/busybox"):
        backend_missing("no static busybox at /bin/busybox (apt-get install busybox-static)")
    tag = f"orchard/images-test-{uuid.uuid4().hex[:8]}:1"
    monkeypatch.setenv("ORCHARD_IMAGE_STATE", str(tmp_path))
    spec = ImageSpec(tag=tag, base="busybox")
    monkeypatch.setattr(images, "TEST_IMAGES", [*images.TEST_IMAGES, spec])
    try:
        assert build_images([tag]) == 0
        out = capsys.readouterr().out
        assert f"building {tag} (missing)" in out and f"{tag} ready in" in out
        assert all(line.startswith("images: ") for line in out.splitlines())
        label = subprocess.run(
            ["docker", "image", "inspect", "-f", f'{{{{index .Config.Labels "{images.SPEC_LABEL}"}}}}', tag],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert label == spec.digest

        assert build_images([tag]) == 0
        assert f"{tag} is up to date, skipped" in capsys.readouterr().out

        changed = ImageSpec(tag=tag, base="busybox", check="test -x /bin/busybox")
        monkeypatch.setattr(images, "TEST_IMAGES", [*images.TEST_IMAGES[:-1], changed])
        assert build_images([tag]) == 0
        assert f"building {tag} (its spec changed)" in capsys.readouterr().out

        assert build_images([tag], force=True) == 0
        assert f"building {tag} (forced)" in capsys.readouterr().out

        from orchard_async.adapters.docker import DockerAdapter

        async def run_in_it() -> str:
            adapter = DockerAdapter(image=tag)
            try:
                box = await adapter.create(oa.SandboxSpec(ttl=60))
                return (await box.exec("echo built")).text
            finally:
                await adapter.close()

        assert asyncio.run(run_in_it()) == "built\n"
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)
