"""The fleet's balancer is Debian's nginx: its config, and what it does with a shed (real nginx,
two in-process pods that count what reaches them)."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from fake_upstream import serve
from slogate_bench.live.balancer import TRIED_HEADER, Balancing, balancer_config, spawned_balancer, tries_of

pytestmark = pytest.mark.usefixtures("nginx_binary")


@dataclass
class Pod:
    """A pod that answers 200, or 429 with a Retry-After while ``shedding``."""

    name: str
    shedding: bool = False
    seen: int = 0
    url: str = ""
    bodies: list[bytes] = field(default_factory=list)

    async def completion(self, request: web.Request) -> web.Response:
        self.seen += 1
        self.bodies.append(await request.read())
        if self.shedding:
            return web.json_response({"error": {"code": "slogate_shed"}}, status=429, headers={"Retry-After": "3"})
        return web.json_response({"pod": self.name})


@asynccontextmanager
async def pods(*names: str) -> AsyncIterator[list[Pod]]:
    async with AsyncExitStack() as stack:
        made = []
        for name in names:
            pod = Pod(name)
            app = web.Application()
            app.router.add_post("/completion", pod.completion)
            pod.url = await stack.enter_async_context(serve(app))
            made.append(pod)
        yield made


def hostport(pod: Pod) -> str:
    return pod.url.removeprefix("http://")


async def post(session: aiohttp.ClientSession, url: str) -> tuple[int, str | None, int]:
    async with session.post(url + "/completion", json={"prompt": "x", "n_predict": 1}) as r:
        body = await r.json()
        return r.status, body.get("pod"), tries_of(r.headers.get(TRIED_HEADER))


def test_the_config_is_valid_nginx_for_every_routing(tmp_path: Path) -> None:
    for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (tmp_path / "temp" / kind).mkdir(parents=True)
    for routing in ("random", "least_conn", "round_robin"):
        for tries in (1, 3):
            text = balancer_config(18125, tmp_path, ["127.0.0.1:1", "127.0.0.1:2"], Balancing(routing, tries))
            assert text.count("max_fails=0;") == 2
            assert ("proxy_next_upstream_tries 3;" in text) == (tries == 3)
            conf = tmp_path / "nginx.conf"
            conf.write_text(text)
            done = subprocess.run(
                ["nginx", "-t", "-p", str(tmp_path), "-c", str(conf), "-e", str(tmp_path / "error.log")],
                capture_output=True,
                text=True,
                check=False,
            )
            assert done.returncode == 0, (routing, tries, done.stderr)


def test_bad_balancing_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown routing"):
        Balancing("fastest")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tries must be >= 1"):
        Balancing("random", 0)
    with pytest.raises(ValueError, match="at least one pod"):
        balancer_config(1, Path("/tmp"), [], Balancing())


def test_tries_are_counted_from_nginx_upstream_addr() -> None:
    assert tries_of(None) == 0
    assert tries_of("127.0.0.1:1") == 1
    assert tries_of("127.0.0.1:1, 127.0.0.1:2") == 2
    assert tries_of("127.0.0.1:1, 127.0.0.1:2 : 127.0.0.1:3") == 3


async def test_a_shed_is_retried_on_the_other_pod_and_the_shedding_pod_stays_in(tmp_path: Path) -> None:
    async with pods("busy", "idle") as (busy, idle):
        busy.shedding = True
        balancing = Balancing("round_robin", tries=2)
        async with (
            spawned_balancer(tmp_path, [hostport(busy), hostport(idle)], balancing) as nginx,
            aiohttp.ClientSession() as session,
        ):
            answers = [await post(session, nginx.url) for _ in range(10)]
            # Every request ends on the idle pod; round robin keeps offering the busy one
            # (max_fails=0: a shed never takes a pod out), so about half needed two tries.
            assert [(status, pod) for status, pod, _ in answers] == [(200, "idle")] * 10
            assert busy.seen >= 4
            assert sum(tries for _, _, tries in answers) == 10 + busy.seen
            # The POST body reached the second pod whole.
            assert all(body == idle.bodies[0] for body in idle.bodies + busy.bodies)
            # Once the busy pod stops shedding it serves again at once (nginx did not mark it down).
            busy.shedding = False
            served = {pod for _, pod, _ in [await post(session, nginx.url) for _ in range(4)]}
            assert served == {"busy", "idle"}


async def test_without_retry_a_shed_reaches_the_client(tmp_path: Path) -> None:
    async with pods("busy", "idle") as (busy, idle):
        busy.shedding = True
        async with (
            spawned_balancer(tmp_path, [hostport(busy), hostport(idle)], Balancing("round_robin", tries=1)) as nginx,
            aiohttp.ClientSession() as session,
        ):
            answers = [await post(session, nginx.url) for _ in range(10)]
        statuses = sorted(status for status, _, _ in answers)
        assert statuses == [200] * idle.seen + [429] * busy.seen
        assert busy.seen == 5
        assert idle.seen == 5
        assert all(tries == 1 for _, _, tries in answers)


async def test_when_every_pod_sheds_the_last_429_and_its_retry_after_reach_the_client(tmp_path: Path) -> None:
    async with pods("a", "b", "c") as fleet:
        for pod in fleet:
            pod.shedding = True
        async with (
            spawned_balancer(tmp_path, [hostport(p) for p in fleet], Balancing("random", tries=2)) as nginx,
            aiohttp.ClientSession() as session,
            session.post(nginx.url + "/completion", json={"prompt": "x"}) as r,
        ):
            assert r.status == 429
            assert r.headers["Retry-After"] == "3"
            assert tries_of(r.headers.get(TRIED_HEADER)) == 2
        assert sum(p.seen for p in fleet) == 2  # bounded: two tries, not three
