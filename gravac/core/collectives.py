"""Collective profiles as data: finding and checking the file `network.collectives` names.

A profile holds, for each collective, the fitted terms of gravac/cluster/netmodel.py's cost
formula (docs/DEFINITIONS.md, "Collective profiles"). It is read here, in the neutral core, so the
config check refuses a missing or broken file in one line before a run or sweep starts; the model
that uses the terms lives in gravac/cluster/netmodel.py.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

COLLECTIVES = ("allreduce", "allgather", "sparse_allgather", "broadcast")
TERMS = ("call_s", "step_s", "link_factor", "pair_factor", "host_s_per_byte", "crowd_step_s")
#: Terms a profile may leave out (0): profiles fitted before crowd_step_s existed stay readable.
OPTIONAL_TERMS = {"crowd_step_s": 0.0}
#: Committed profiles: `network.collectives=NAME` reads NAME.json here.
PROFILE_DIR = Path(__file__).resolve().parents[2] / "results" / "reference" / "collectives"


class ProfileError(ValueError):
    """A profile file is missing or broken; the message is one line, without the option's name."""


def profile_path(spec: str) -> Path:
    """The file `spec` names: a path when it holds a '/' or ends in .json, else a committed profile."""
    return Path(spec) if spec.endswith(".json") or "/" in spec else PROFILE_DIR / f"{spec}.json"


def read_profile(spec: str) -> dict:
    """The checked content of profile `spec` (not `ideal`): {"name", "note", "collectives": {kind:
    {term: float}}}; ProfileError says what is wrong."""
    path = profile_path(spec)
    if not path.is_file():
        names = sorted(p.stem for p in PROFILE_DIR.glob("*.json")) if PROFILE_DIR.is_dir() else []
        raise ProfileError(f"no such profile ({path} not found); use ideal, "
                           + (", ".join(names) + ", " if names else "") + "or the path of a profile file")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProfileError(f"{path} cannot be read as JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("collectives"), dict):
        raise ProfileError("not a collective profile (a JSON object with a \"collectives\" object); "
                           "write one with `python bench/netval.py --fit`")
    out = {}
    for kind in COLLECTIVES:
        entry = data["collectives"].get(kind)
        if not isinstance(entry, dict):
            raise ProfileError(f"collective {kind!r} is missing (a profile needs {', '.join(COLLECTIVES)})")
        for t in TERMS:
            v = entry.get(t, OPTIONAL_TERMS.get(t))
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
                    or (t == "link_factor" and v <= 0):
                raise ProfileError(f"{kind}.{t} is {json.dumps(v)}, not a number {'> 0' if t == 'link_factor' else '>= 0'} "
                                   f"(each collective needs {', '.join(t for t in TERMS if t not in OPTIONAL_TERMS)})")
        out[kind] = {t: float(entry.get(t, OPTIONAL_TERMS.get(t))) for t in TERMS}
    return {"name": str(data.get("name") or path.stem), "note": str(data.get("note", "")), "collectives": out}


def profile_problem(spec: str) -> str | None:
    """Why `spec` cannot be used as network.collectives (one line), or None."""
    if spec == "ideal":
        return None
    try:
        read_profile(spec)
    except ProfileError as e:
        return str(e)
    return None
