"""`agentrl-ray view [RUN_DIR ...]`: a local web page of runs, their curves, health, rollouts and evaluations.

    agentrl-ray view                         # every run under runs/ (this folder's)
    agentrl-ray view runs/calculator runs/calculator-2 --port 8766
    agentrl-ray view runs --host 0.0.0.0     # reachable from other machines: the URL printed carries a token

A Starlette application (FastAPI, installed with Ray's dashboard) served by uvicorn: one static page (`static/`,
uPlot for the charts, vendored: nothing is fetched from the network) and a small JSON API over the run folders
(`runs.py`), which the page polls every 2 s. It reads the folders and never writes them: the cost to a training run
is measured in docs/viewer.md.

Bound to 127.0.0.1 by default: only this machine's users reach it. Bound to any other address it asks for a token
(made up at start, or `--token`): the page's URL carries it once, then a cookie does.
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path
from typing import Any

from agentrl_ray.view.runs import RunFolder, find_runs, has_error

STATIC = Path(__file__).parent / "static"
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
COOKIE = "agentrl_view_token"


class Runs:
    """The run folders under the paths given, found again on every listing (a run started later appears)."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self.folders: dict[str, RunFolder] = {}

    def listing(self) -> list[dict[str, Any]]:
        found = find_runs(self.paths)
        self.folders = {n: self.folders.get(n) or RunFolder(n, p) for n, p in found.items()}
        return [f.status() for f in self.folders.values()]

    def get(self, name: str) -> RunFolder:
        from fastapi import HTTPException

        if name not in self.folders:
            self.listing()
        if name not in self.folders:
            raise HTTPException(404, f"no run named {name!r}")
        return self.folders[name]


def make_app(paths: list[Path], token: str | None = None):
    from fastapi import FastAPI, Request
    from fastapi.responses import FileResponse, JSONResponse
    from fastapi.staticfiles import StaticFiles

    runs = Runs(paths)
    app = FastAPI(title="agentrl-ray view", docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def check_token(request: Request, call_next):
        if token is None:
            return await call_next(request)
        given = request.query_params.get("token") or request.cookies.get(COOKIE)
        if not (given and secrets.compare_digest(given, token)):
            return JSONResponse({"detail": "this viewer needs its token: open the URL it printed"}, 403)
        response = await call_next(request)
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict")
        return response

    @app.get("/")
    def index():
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/api/runs")
    def run_list():
        return runs.listing()

    @app.get("/api/metrics")
    def metrics(run: str, since: int = 0):
        records = runs.get(run).records(since)
        return {"records": records, "next": since + len(records)}

    @app.get("/api/rollouts")
    def rollouts(
        run: str,
        step: int | None = None,
        min_reward: float | None = None,
        max_reward: float | None = None,
        errors: bool = False,
    ):
        folder = runs.get(run)
        steps = folder.rollout_steps()
        step = step if step is not None else (steps[-1] if steps else None)
        return {"steps": steps, "step": step, "records": folder.rollouts(step, min_reward, max_reward, errors)}

    @app.get("/api/evals")
    def evals(run: str):
        return runs.get(run).evals()

    @app.get("/api/transcripts")
    def transcripts(run: str, name: str, errors: bool = False, min_reward: float | None = None):
        out = runs.get(run).transcripts(name)
        out = [t for t in out if (not errors or has_error(t)) and (min_reward is None or t["reward"] >= min_reward)]
        return {"records": out}

    return app


def add_arguments(p) -> None:
    p.add_argument("paths", nargs="*", metavar="RUN_DIR", help="run folders, or folders of runs (default: runs/)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765)")
    p.add_argument("--token", help="the token another --host asks for (default: a new random one)")


def main(args) -> int:
    import uvicorn

    from agentrl_ray.config import ConfigError

    paths = [Path(p).expanduser() for p in (args.paths or ["runs"])]
    missing = [str(p) for p in paths if not p.is_dir()]
    if missing:
        raise ConfigError(f"no such folder: {', '.join(missing)} (give run folders or a folder of runs)")
    token = None if args.host in LOCAL_HOSTS else (args.token or secrets.token_urlsafe(16))
    url = f"http://{args.host}:{args.port}/" + (f"?token={token}" if token else "")
    count = len(find_runs(paths))
    print(f"agentrl-ray view: {url} ({count} runs under {', '.join(map(str, paths))}; Ctrl-C stops)", flush=True)
    uvicorn.run(make_app(paths, token), host=args.host, port=args.port, log_level="warning")
    print("agentrl-ray view: stopped", file=sys.stderr)
    return 0
