"""The docs stand on their own and say what runs write.

A clone holds nothing outside its root, so no tracked Markdown file, script docstring or config
comment may point there, and every relative link must resolve (file and section). docs/RUN_FILES.md
must list every file, step field and summary field that real tiny runs of every registered method
write, and no step field that none of them writes.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, failure, run_cli_many

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
UP = re.compile(r"(?:\.\./)+[\w.\-/]*")
SOURCES = ("bench", "plots", "gravac", "compressors", "conf")   # user-facing docstrings and comments


def tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / p for p in out.stdout.split()]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(md: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in md.read_text().splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            s = slug(m.group(1))
            out.add(s if s not in seen else f"{s}-{seen[s]}")
            seen[s] = seen.get(s, 0) + 1
    return out


def outside(path: str, base: Path, root: Path = ROOT) -> bool:
    """True when `path` (relative to `base`) leaves `root` and is not a repository path reached
    from a subfolder (e.g. `../../plots/paper.py` run from results/reference)."""
    tail = re.sub(r"^(?:\.\./)+", "", path).rstrip("/.")
    if not tail or (base / path).resolve().is_relative_to(root):
        return False
    return not (root / tail).exists()


def broken_links(md: Path, root: Path = ROOT) -> list[str]:
    """Relative links of `md` to a file outside `root`, a missing file, or a missing section."""
    bad = []
    for target in LINK.findall(md.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):          # https:, mailto: ...
            continue
        path, _, frag = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if not dest.is_relative_to(root) or not dest.exists():
            bad.append(f"{md.relative_to(root)}: link to missing or outside file {target}")
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            bad.append(f"{md.relative_to(root)}: link to missing section {target}")
    return bad


def outside_refs(path: Path, root: Path = ROOT) -> list[str]:
    """Paths in `path`'s text that leave `root`, and absolute paths of this machine's /work."""
    text = path.read_text()
    found = [m for m in UP.findall(text) if outside(m, path.parent, root)] + re.findall(r"/work/[\w./-]*", text)
    return [f"{path.relative_to(root)}: refers to {m}" for m in found]


def test_markdown_links_resolve_inside_the_repository():
    bad = [b for md in tracked("*.md") for b in broken_links(md) + outside_refs(md)]
    assert not bad, "\n".join(bad)


def test_sources_do_not_point_outside_the_repository():
    files = [p for p in tracked(*SOURCES) if p.suffix in (".py", ".yaml")]
    bad = [b for p in files for b in outside_refs(p)]
    assert not bad, "\n".join(bad)


def test_checks_catch_what_they_are_for(tmp_path):
    """Each checker flags what it is for and passes what is fine."""
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "paper.py").write_text("")
    (tmp_path / "README.md").write_text("# Title\n\n## Set up\n")
    md = tmp_path / "x.md"
    md.write_text("[a](../shared/DESIGN.md) [b](docs/NOPE.md) [c](README.md#no-such-section) "
                  "[d](README.md#set-up) [e](https://example.org/x.md) ![f](plots/paper.py)\n"
                  "see `../shared/PAPER.md` and /work/shared/data; `cd sub && python ../plots/paper.py`\n")
    bad = broken_links(md, tmp_path)
    assert len(bad) == 3 and all(s in " ".join(bad) for s in ("../shared", "NOPE", "no-such-section")), bad
    refs = outside_refs(md, tmp_path)
    assert len(refs) == 3 and "../shared/DESIGN.md" in refs[0] and "/work/shared/data" in refs[2], refs
    assert slug("Why GraVAC stays dense on CNNs: the gain definition and the scale") == \
        "why-gravac-stays-dense-on-cnns-the-gain-definition-and-the-scale"
    assert slug("`method=static`") == "methodstatic"


# --- docs/RUN_FILES.md against real runs ------------------------------------------------------------
DOC = ROOT / "docs" / "RUN_FILES.md"
SMALL = ["dataset.image_size=8", "dataset.train_size=64", "dataset.test_size=32", "model.width=4",
         "train.batch_size=8", "train.eval_every=5", "logger.progress=false", "cluster.workers=2",
         "cluster.threads=1"]
# what a method needs to write all its fields within 5 steps; every registered method is run
SETTINGS = {
    "gravac": ["method.window=2"],                                   # window ends: cf_min, cs move
    "static": ["compressor.cf=10", "method.probe_cfs=[100]"],        # probe fields
    "accordion": ["method.switch_freq=1"],                          # a regime check at step 4 (4 steps an epoch)
    "accordion_powersgd": ["method.switch_freq=1"],                 # the same with PowerSGD ranks
    "mergecomp": ["method.search=exhaustive", "method.warmup=0"],  # candidates timed and chosen at step 0
    "lgreco": ["method.period=2", "method.window=1"],          # solves at steps 2 and 4
    "lgreco_accordion": ["method.period=2", "method.window=1", "method.switch_freq=1"],   # and a check at 4
    "lgreco_powersgd": ["method.period=2", "method.window=1"],  # solves at steps 2 and 4
}


def documented(section: str) -> set[str]:
    """Backticked names in the first column of the tables under the `## ...` heading `section`."""
    text = DOC.read_text()
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    rows = [line.split("|")[1] for line in text[start:end if end > 0 else None].splitlines()
            if line.startswith("| `")]
    return {n for cell in rows for n in re.findall(r"`([^`]+)`", cell)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One tiny checkpointed run of every method the project registers, {method: run folder}.

    Methods other test modules register in this process (test_plugins' toy) are left out: the
    subprocess run here does not load them, and the docs describe the project's own methods.
    """
    from gravac.config.plugins import registries
    methods = registries()["method"]
    names = [n for n in methods if methods[n].target.__module__.startswith("gravac.")]
    roots = [tmp_path_factory.mktemp(name) for name in names]
    jobs = [dict(args=[*SMALL, f"experiment.results_root={root}", f"method={name}", "train.steps=5",
                       "train.checkpoint_every=2", *SETTINGS.get(name, [])], timeout=300)
            for name, root in zip(names, roots)]
    out = {}
    for name, root, r in zip(names, roots, run_cli_many(jobs)):       # two at a time
        assert r.returncode == 0, f"method={name}: " + failure(r)
        (out[name],) = [p for p in root.glob("*/*") if p.is_dir()]
    return out


def test_documented_step_fields_are_the_ones_runs_write(runs):
    written = {k for run in runs.values() for line in (run / "steps.jsonl").read_text().splitlines()
               for k in json.loads(line)}
    doc = documented("`steps.jsonl`")
    assert not written - doc, f"step fields missing from {DOC.name}: {sorted(written - doc)}"
    assert not doc - written, f"{DOC.name} lists step fields no run wrote: {sorted(doc - written)}"


def test_documented_summary_and_eval_fields_cover_what_runs_write(runs):
    for run in runs.values():
        summary = json.loads((run / "summary.json").read_text())
        assert set(summary) <= documented("`summary.json`"), sorted(set(summary) - documented("`summary.json`"))
        evals = {k for line in (run / "evals.jsonl").read_text().splitlines() for k in json.loads(line)}
        assert evals <= documented("`evals.jsonl`"), sorted(evals - documented("`evals.jsonl`"))


def test_documented_files_cover_the_run_folder(runs):
    names = documented("The run folder")
    files = {p.relative_to(run).parts[0] for run in runs.values() for p in run.rglob("*")}
    assert {"checkpoint", "ready.jsonl", "model.pt", ".lock"} <= files
    missing = {f for f in files if f not in names and f + "/" not in names}
    assert not missing, f"files a run writes missing from {DOC.name}: {sorted(missing)}"


def _summary_dense() -> dict[str, dict[str, str]]:
    """Each study experiment's Dense row of results/reference/summary.md, by column name."""
    out, exp, heads = {}, None, None
    for line in (ROOT / "results" / "reference" / "summary.md").read_text().splitlines():
        if line.startswith("### "):
            exp, heads = line.split()[1], None
        elif line.startswith("| setting |"):
            heads = [c.strip() for c in line.strip("|").split("|")]
        elif exp and heads and line.startswith("| Dense |"):
            out[exp] = dict(zip(heads, (c.strip() for c in line.strip("|").split("|"))))
    return out


def test_reproducing_quotes_the_curated_dense_numbers():
    """REPRODUCING's family table states each target by dense's curve: its step and final metric
    must be the curated summary's (they once drifted to numbers of an older run, issue 41)."""
    dense = _summary_dense()
    assert set(dense) == {"mini_vgg", "mini_resnet", "mini_lstm"}
    text = (ROOT / "REPRODUCING.md").read_text()
    for exp, row in dense.items():
        line = next(ln for ln in text.splitlines() if ln.startswith(f"| `{exp}` |"))
        seeds = "one seed" if row["seeds"] == "1" else f"{row['seeds']} seeds"
        want = f"(dense, {seeds}: step {row['target at step']}, ends at {row['final']})"
        assert want in line, f"REPRODUCING's {exp} row should say {want}: {line}"


@pytest.mark.parametrize("exp", ["mini_vgg", "mini_resnet", "mini_lstm"])
def test_reproducing_family_row_quotes_the_curated_dense_runs(exp):
    """The family table's dense step to target and final metric are the means over the dense
    seeds of results/reference/<exp>/runs.csv (the test above holds the row to summary.md, which
    is made from those runs; this holds it to the runs themselves)."""
    dense = _curated(exp)["Dense"]
    line = next(ln for ln in (ROOT / "REPRODUCING.md").read_text().splitlines() if ln.startswith(f"| `{exp}` |"))
    m = re.search(r"\(dense, (?:one seed|(\d+) seeds): step (\d+)(?: \[[^\]]*\])?, ends at ([\d.]+)", line)
    assert m, line
    assert int(m.group(1) or 1) == len(dense)
    assert int(m.group(2)) == round(_mean(dense, "target_step"))
    final = _mean(dense, "final_metric") * (1 if dense[0]["metric"] == "perplexity" else 100)
    assert _quotes(final, m.group(3)), (m.group(3), final)


# --- README's config groups table against conf/ and the registries (issue 41) ------------------------
def _readme_section(heading: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"\n{heading}\n")
    return text[start:text.find("\n#", start + len(heading) + 2)]


def _group_rows() -> dict[str, str]:
    """{group: its options cell} of README's "Config groups" table."""
    rows = [line.split("|") for line in _readme_section("### Config groups (`conf/`)").splitlines()
            if line.startswith("| `")]
    return {re.fullmatch(r"\s*`(\w+)`\s*", r[1]).group(1): r[2] for r in rows}


def _groups() -> list[str]:
    from gravac.core.schema import PLUGGABLE
    conf = ROOT / "conf"
    return sorted({p.name for p in conf.iterdir() if p.is_dir() and p.name != "hydra"} | set(PLUGGABLE))


def test_readme_has_one_config_groups_row_per_group():
    assert sorted(_group_rows()) == _groups()


@pytest.mark.parametrize("group", _groups())
def test_readme_config_groups_row_names_every_option_and_no_other(group):
    """Each row's options cell holds, backticked, every option `--help` offers (the registries
    for plug-in kinds, conf/<group>/*.yaml for the rest), and no name that is not one: the method
    row listed 4 of 10 methods and the arm row missed the COVAP, MergeComp, ExDyna/MiCRO, PowerSGD
    and 8000x arms."""
    from gravac.config.compose import group_options
    from gravac.config.plugins import registries
    reg = registries().get(group)
    built_in = lambda name: reg is None or name not in reg or \
        reg[name].target.__module__.startswith(("gravac.", "compressors."))   # noqa: E731  (not a test's plug-in)
    options = {o for o in group_options(group, str(ROOT / "conf")) if built_in(o)}
    shown = {t for t in re.findall(r"`([^`]+)`", _group_rows()[group]) if re.fullmatch(r"\w+", t)}   # names, not paths
    assert not options - shown, f"README's {group} row misses {sorted(options - shown)}"
    assert not shown - options, f"README's {group} row names {sorted(shown - options)}, not options of {group}"


def _needs_data(arg: str) -> str | None:
    """The dataset a `group=option` argument of bench/run.py reads from files, else None."""
    group, _, option = arg.partition("=")
    if group == "dataset":
        return option if option != "synthetic" else None
    path = ROOT / "conf" / group / f"{option}.yaml"
    if group in ("model", "experiment") and path.exists():
        m = re.search(r"override /dataset: (\w+)", path.read_text())
        return m.group(1) if m and m.group(1) != "synthetic" else None
    return None


def _readme_commands() -> list[tuple[str, str]]:
    """(command, the comments around it) for each bench/run.py command in README's shell blocks:
    its own trailing comment and the comment lines just above it."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S):
        lines, comments = block.replace("\\\n", " ").splitlines(), []
        for line in lines:
            if line.lstrip().startswith("#"):
                comments.append(line)
                continue
            if "bench/run.py" in line:
                out.append((line.split("#")[0], " ".join(comments) + " " + line.partition("#")[2]))
            comments = []
    return out


def test_readme_examples_that_need_a_dataset_say_so():
    """A README command whose dataset must be on disk (dataset=, or a model or experiment preset
    that sets one) says, beside it, that it needs that dataset; --cfg job and --help read none."""
    missing = []
    for command, comments in _readme_commands():
        if "--cfg" in command or "--help" in command:
            continue
        for arg in command.split():
            name = _needs_data(arg)
            label = name and {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100", "ptb": "PTB"}[name]
            if name and not ("needs" in comments and label in comments):
                missing.append(f"{command.strip()} (needs {label})")
    assert not missing, "README commands without their data note:\n" + "\n".join(missing)


# --- REPRODUCING's static tables against the curated runs (issue 41) -------------------------------
FAMILIES = {"ResNet-8": "mini_resnet", "vgg_mini": "mini_vgg", "LSTM": "mini_lstm"}
SETTINGS_OF = {"dense": "Dense", "GraVAC (ε 0.7)": "GraVAC ε=0.7 (dgc)"}     # other columns are setting names


def _curated(exp: str) -> dict[str, list[dict]]:
    """results/reference/<exp>/runs.csv: {setting: its runs (one per seed)}."""
    import csv
    out: dict[str, list[dict]] = {}
    with open(ROOT / "results" / "reference" / exp / "runs.csv") as f:
        for row in csv.DictReader(f):
            out.setdefault(row["setting"], []).append(row)
    return out


def _mean(runs: list[dict], key: str) -> float | None:
    values = [float(r[key]) for r in runs if r[key] not in ("", "None")]
    return sum(values) / len(values) if values else None


def _speedup(runs: dict[str, list[dict]], setting: str) -> float | None:
    """Top-k 10x's mean modelled seconds to target over the setting's (seeds that reached it)."""
    mine = _mean(runs[setting], "model_s_to_target")
    return None if mine is None else _mean(runs["Top-k 10x"], "model_s_to_target") / mine


def _quotes(value: float | None, cell: str) -> bool:
    """`cell` states `value` to the digits it shows ('—' for None)."""
    m = re.match(r"\s*(—|[\d.]+)(%|x)?", cell)
    if m.group(1) == "—" or value is None:
        return m.group(1) == "—" and value is None
    shown = m.group(1)
    digits = len(shown.partition(".")[2])
    return abs(float(shown) - value) <= 0.5 * 10 ** -digits + 1e-9


def _md_table(text: str, header_start: str) -> list[dict[str, str]]:
    """The rows of the Markdown table whose header line starts with `header_start`, by column."""
    lines = text.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    heads = [c.strip() for c in lines[i].strip("|").split("|")]
    rows = []
    for line in lines[i + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(heads, (c.strip() for c in line.strip("|").split("|")))))
    return rows


def _static_cells() -> list[tuple[str, str, str, str]]:
    """(table, family row, column, cell) of every number REPRODUCING's static tables quote from
    the study: final metrics and speedups vs Top-k 10x (paper Table 2's layout and ours), and the
    mean compression gains."""
    text = (ROOT / "REPRODUCING.md").read_text()
    cells = []
    rows = _md_table(text, "| family (target) |")
    for row, speed in zip(rows[0::2], rows[1::2]):
        family = row["family (target)"].split(",")[0]
        for col in list(row)[1:]:
            cells += [("final", family, col, row[col]), ("speedup", family, col, speed[col])]
    for row in _md_table(text, "| family | Top-k 10x |"):
        cells += [("gain", row["family"], col, row[col]) for col in list(row)[1:]]
    for row in _md_table(text, "| | Top-k 10x |"):
        family = next((f for f in FAMILIES if row[""].startswith(f"ours {f}")), None)
        for col in list(row)[1:] if family else []:
            final, _, speed = row[col].partition(", ")
            cells += [("final", family, col, final), ("speedup", family, col, speed)]
    return cells


@pytest.mark.parametrize("table,family,column,cell", _static_cells())
def test_reproducing_static_tables_quote_the_curated_runs(table, family, column, cell):
    """Each final metric, speedup and mean gain REPRODUCING's static-compression tables quote
    is the mean over the seeds in results/reference/<family>/runs.csv, to the digits shown."""
    runs = _curated(FAMILIES[family])
    setting = SETTINGS_OF.get(column, column)
    value = {"final": lambda: _mean(runs[setting], "final_metric"), "speedup": lambda: _speedup(runs, setting),
             "gain": lambda: _mean(runs[setting], "mean_gain")}[table]()
    if table == "final" and runs[setting][0]["metric"] != "perplexity":
        value *= 100                                                    # top-1 is quoted in percent
    assert _quotes(value, cell), f"REPRODUCING's {table} for {family} {column} reads {cell!r}; the curated runs give {value}"


def test_timings_says_what_ran_how_long_and_under_what_load():
    """bench/timings.py measures the README's durations (issue 41: timings measured, not typed)."""
    import sys as _sys
    _sys.path.insert(0, str(ROOT / "bench"))
    import timings
    out = timings.line("a command", [_sys.executable, "-c", "print('first'); print('the end')"])
    assert re.fullmatch(r"- a command: \d+ s \(\d+\.\d min\), exit 0, on \d+ cores at load [\d.]+ -> [\d.]+; "
                        r"last line: the end", out), out
    assert "exit 3" in timings.line("failing", [_sys.executable, "-c", "raise SystemExit(3)"])
