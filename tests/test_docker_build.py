# SPDX-License-Identifier: Apache-2.0
"""Images made, found and shared from a target, driven by the Docker SDK for Python and
the stock docker CLI: per-target registry settings (`--registry-mirror`,
`--insecure-registry`) in `info` and honoured by pulls, `search` over a registry's
catalog, `push` and pull back, and `build` with buildah on the target.

Two loopback docker-registry instances: one holds busybox (built offline with umoci), the
other serves as the target's Docker Hub mirror (holding `library/busybox`), so `docker
pull busybox` can only succeed through the mirror: there is no internet here.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from urllib.parse import quote

import pytest

from helpers import cli_json, free_port, run_cli
from test_containers import Env, busybox_registry, docker_target, need

docker = pytest.importorskip("docker", reason="the Docker SDK for Python (make deps installs it)")

INSECURE_RANGE = "10.77.0.0/16"
INSECURE_HOST = "registry.example.com:5000"


class BuildEnv(Env):
    mirror: str
    namespace: Path

    def images(self) -> set[str]:
        return set(self.ok("images", "-q", "--no-trunc").split())


@pytest.fixture(scope="module")
def env():
    if os.geteuid() != 0:
        pytest.skip("containers need root (runc, overlayfs, loop devices)")
    need("docker", "runc", "docker-registry", "skopeo", "umoci", "buildah")
    d = Path(tempfile.mkdtemp(prefix="insitu-build-", dir="/var/tmp"))
    stack = contextlib.ExitStack()
    try:
        reg, image = stack.enter_context(busybox_registry(d))
        # Docker Hub's mirror: busybox where Docker Hub keeps it.
        mirror, _ = stack.enter_context(busybox_registry(d, "library/busybox", "mirror"))
        ns = d / "ns.img"
        cli_json("image", "create", ns, "--size", "64M", "--fs", "ext4")
        registries = ["--registry-mirror", f"http://{mirror}", "--insecure-registry", INSECURE_RANGE, "--insecure-registry", INSECURE_HOST]
        target_listen, api = stack.enter_context(docker_target(d, "nqn.2024-01.io.insitu:build", ns, *registries))
        e = BuildEnv(d, api, reg, image, d / "unused", target_listen)
        e.mirror, e.namespace = mirror, ns
        e.ok("pull", image)
        yield e
    finally:
        stack.close()
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def client(env: BuildEnv):
    c = docker.DockerClient(base_url=f"tcp://{env.api}", version="auto", timeout=120)
    yield c
    c.close()


def context_tar(files: dict[str, str]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


# --------------------------------------------------------------------------- registry settings


def test_registry_settings_show_in_info_as_moby_shapes_them(client, env: BuildEnv):
    for rc in (client.info()["RegistryConfig"], json.loads(env.ok("info", "--format", "{{json .RegistryConfig}}"))):
        assert set(rc["InsecureRegistryCIDRs"]) == {"::1/128", "127.0.0.0/8", INSECURE_RANGE}
        assert rc["Mirrors"] == [f"http://{env.mirror}/"]
        assert rc["IndexConfigs"]["docker.io"] == {"Name": "docker.io", "Mirrors": [f"http://{env.mirror}/"], "Secure": True, "Official": True}
        assert rc["IndexConfigs"][INSECURE_HOST] == {"Name": INSECURE_HOST, "Mirrors": [], "Secure": False, "Official": False}


def test_bad_registry_settings_stop_the_start_by_name(env: BuildEnv):
    priv = env.d / "other-private.img"
    priv.touch()
    base = ["target", "start", "--listen", f"127.0.0.1:{free_port()}", "--namespace", env.namespace, "--private", priv]
    for flag, value, said in [
        ("--insecure-registry", "http://x:5000", "--insecure-registry"),
        ("--insecure-registry", "10.0.0.0/40", "not a CIDR"),
        ("--registry-mirror", "mirror.example.com", "--registry-mirror"),
        ("--registry-mirror", "http://10.9.9.9:5000", "--insecure-registry 10.9.9.9:5000"),
    ]:
        r = run_cli(*base, "--docker", f"127.0.0.1:{free_port()}", flag, value)
        assert r.rc != 0 and said in r.stderr, (value, r.stderr)
    r = run_cli(*base, "--registry-mirror", f"http://{env.mirror}")
    assert r.rc != 0 and "--docker" in r.stderr, r.stderr


def test_docker_hub_names_are_pulled_through_the_mirror(client, env: BuildEnv):
    out = env.ok("pull", "busybox")
    assert "Digest: sha256:" in out
    assert env.ok("run", "--rm", "busybox", "echo", "from the mirror").strip() == "from the mirror"
    img = client.images.pull("busybox", tag="latest")
    assert "busybox:latest" in img.tags
    # What the mirror does not hold falls back to Docker Hub, out of reach here.
    r = env.docker("pull", "no-such-image-anywhere")
    assert r.returncode != 0 and ("not found" in r.stderr.lower() or "no such image" in r.stderr.lower()), r.stderr


# --------------------------------------------------------------------------- search


def test_search_lists_a_registrys_catalog(client, env: BuildEnv):
    hits = client.images.search(f"{env.registry}/busy")
    assert [h["name"] for h in hits] == [f"{env.registry}/busybox"]
    assert hits[0]["is_official"] is False and hits[0]["star_count"] == 0
    # A Docker Hub term searches the mirror, where library/ images are official.
    hits = client.images.search("busy")
    assert [(h["name"], h["is_official"]) for h in hits] == [("busybox", True)]
    out = env.ok("search", "--format", "{{.Name}} {{.IsOfficial}}", "busy")
    assert out.split() == ["busybox", "[OK]"]
    for term, filters in [(f"{env.registry}/busy", {"is-official": ["true"]}), ("busy", {"stars": ["1"]}), ("busy", {"is-automated": ["true"]})]:
        status, body = env.request("GET", f"/v1.47/images/search?term={quote(term, safe='')}&filters={quote(json.dumps(filters))}")
        assert status == 200 and json.loads(body) == [], (term, filters, body)
    status, body = env.request("GET", f"/v1.47/images/search?term=busy&filters={quote(json.dumps({'is-official': ['true']}))}")
    assert status == 200 and [h["name"] for h in json.loads(body)] == ["busybox"]
    assert client.images.search(f"{env.registry}/nothing-like-it") == []


def test_search_refuses_bad_input_and_says_when_the_registry_is_away(env: BuildEnv):
    for query, said in [
        ("term=busy&limit=500", "limit"),
        ("term=busy&filters=%7B%22stars%22%3A%5B%22many%22%5D%7D", "stars"),
        ("term=busy&filters=%7B%22is-official%22%3A%5B%22maybe%22%5D%7D", "is-official"),
        ("term=busy&filters=%7B%22colour%22%3A%5B%22red%22%5D%7D", "colour"),
        ("limit=5", "term"),
    ]:
        status, body = env.request("GET", f"/v1.47/images/search?{query}")
        assert status == 400 and said in json.loads(body)["message"], (query, body)
    away = f"127.0.0.1:{free_port()}"
    r = env.docker("search", f"{away}/busy")
    assert r.returncode != 0 and "cannot reach" in r.stderr and away in r.stderr, r.stderr


# --------------------------------------------------------------------------- push


def test_push_then_pull_back_under_another_name(client, env: BuildEnv):
    name = f"{env.registry}/pushed/busybox"
    env.ok("tag", env.image, f"{name}:v1")
    out = env.ok("push", f"{name}:v1")
    assert f"The push refers to repository [{name}]" in out and "v1: digest: sha256:" in out
    env.ok("rmi", f"{name}:v1")
    assert f"{name}:v1" not in env.ok("images", "--format", "{{.Repository}}:{{.Tag}}")
    env.ok("pull", f"{name}:v1")
    assert env.ok("run", "--rm", f"{name}:v1", "echo", "round trip").strip() == "round trip"
    # The SDK, with credentials (the registry asks for none, so they are not needed).
    client.images.get(env.image).tag(f"{name}", "v2")
    lines = list(client.images.push(name, tag="v2", stream=True, decode=True, auth_config={"username": "u", "password": "p"}))
    assert not any("error" in l for l in lines), lines
    aux = [l["aux"] for l in lines if "aux" in l]
    assert aux and aux[0]["Tag"] == "v2" and aux[0]["Digest"].startswith("sha256:")
    client.images.remove(f"{name}:v2")
    assert client.images.pull(name, tag="v2").id == client.images.get(env.image).id


def test_push_errors_come_in_the_stream(client, env: BuildEnv):
    lines = list(client.api.push(f"{env.registry}/never-tagged", tag="x", stream=True, decode=True))
    assert any("No such image" in l.get("error", "") for l in lines), lines
    away = f"127.0.0.1:{free_port()}"
    env.ok("tag", env.image, f"{away}/x:1")
    r = env.docker("push", f"{away}/x:1")
    assert r.returncode != 0 and "cannot reach" in r.stderr, r.stderr
    bad = base64.urlsafe_b64encode(b"not json").decode()
    status, body = env.request("POST", f"/v1.47/images/{env.registry}%2Fx/push?tag=1", headers={"X-Registry-Auth": bad})
    assert status == 400 and "X-Registry-Auth" in json.loads(body)["message"]


# --------------------------------------------------------------------------- build


def test_docker_build_with_the_stock_cli_then_run_it(env: BuildEnv):
    ctx = env.d / "ctx-cli"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(f"FROM {env.image}\nRUN echo built on the target > /greeting\n")
    p = env.docker("build", "-t", "cli-built:1", str(ctx), timeout=300)
    assert p.returncode == 0, p.stderr
    assert "Successfully tagged cli-built:1" in p.stdout, p.stdout
    assert env.ok("run", "--rm", "cli-built:1", "cat", "/greeting").strip() == "built on the target"
    assert "cli-built" in env.ok("images", "--format", "{{.Repository}}")


def test_sdk_build_with_args_labels_and_quiet(client, env: BuildEnv):
    ctx = context_tar(
        {
            "build/Custom.dockerfile": f"FROM {env.image}\nARG WORD=unset\nCOPY note.txt /note.txt\nRUN echo $WORD > /word\n",
            "note.txt": "from the context\n",
        }
    )
    img, logs = client.images.build(
        fileobj=ctx,
        custom_context=True,
        dockerfile="build/Custom.dockerfile",
        tag="sdk-built:2",
        buildargs={"WORD": "argued"},
        labels={"made": "here"},
        rm=True,
    )
    assert "sdk-built:2" in img.tags and img.labels.get("made") == "here"
    assert any("aux" in l for l in logs)
    out = client.containers.run("sdk-built:2", ["sh", "-c", "cat /word /note.txt"], remove=True)
    assert out == b"argued\nfrom the context\n"
    ctx = context_tar({"Dockerfile": f"FROM {env.image}\nRUN true\n"})
    img, logs = client.images.build(fileobj=ctx, custom_context=True, quiet=True)
    assert [l["stream"].strip() for l in logs if "stream" in l] == [img.id]


def test_build_errors_are_clear_and_store_nothing(client, env: BuildEnv):
    before = env.images()
    cases = [
        ({"Dockerfile": f"FROM {env.image}\nFROBNICATE now\n"}, "FROBNICATE"),
        ({"Dockerfile": f"FROM {env.registry}/no-such-base:latest\nRUN true\n"}, "no-such-base"),
        ({"Dockerfile": f"FROM {env.image}\nRUN exit 7\n"}, "exit"),
        ({"Other": "FROM scratch\n"}, "Dockerfile"),
    ]
    for files, said in cases:
        with pytest.raises(docker.errors.BuildError) as e:
            client.images.build(fileobj=context_tar(files), custom_context=True, tag="should-not-exist")
        assert said in str(e.value), (files, str(e.value))
    # A context that climbs out of its directory is refused before anything is built.
    evil = context_tar({"Dockerfile": f"FROM {env.image}\n", "../escape": "x"})
    status, body = env.request("POST", "/v1.47/build?t=should-not-exist", body=evil.getvalue(), headers={"Content-Type": "application/x-tar"})
    assert status == 400 and "climbs out" in json.loads(body)["message"], body
    for query, said in [("remote=http%3A%2F%2Fx", "remote"), ("dockerfile=..%2FDockerfile", "dockerfile"), ("version=2", "BuildKit"), ("t=Bad%20Name", "t=")]:
        status, body = env.request("POST", f"/v1.47/build?{query}", body=context_tar({"Dockerfile": "FROM scratch\n"}).getvalue())
        assert status == 400 and said in json.loads(body)["message"], (query, body)
    empty = env.d / "ctx-empty"
    empty.mkdir(exist_ok=True)
    r = env.docker("build", "-t", "should-not-exist", "-f", "-", str(empty), input="FROM scratch\nNOPE x\n")
    assert r.returncode != 0 and "NOPE" in r.stderr, r.stderr
    assert env.images() == before
    assert "should-not-exist" not in env.ok("images", "--format", "{{.Repository}}")


def test_built_images_are_refused_for_push_by_name(env: BuildEnv):
    r = env.docker("tag", "cli-built:1", f"{env.registry}/built:1")
    if r.returncode != 0:
        pytest.skip("the CLI build test did not run")
    r = env.docker("push", f"{env.registry}/built:1")
    assert r.returncode != 0 and "cannot be saved or pushed" in r.stderr, r.stderr
