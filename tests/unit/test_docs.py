"""The docs cannot rot: every relative link and anchor of README.md and docs/ resolves, every
page is listed in docs/index.md, every repository path they name exists, users' pages keep
their sentences under 35 words, every page of docs/measurements/ starts with its dates and
commits, and the README's knobs table has exactly
the knobs of the communicator's settings object (nnabla_torus/comm/settings.py) with their
defaults. Offline and under a second.

Anchors follow GitHub's rule: the heading in lower case, punctuation other than - and _
dropped, spaces as -, and -1, -2, ... for repeats.
"""
import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(ROOT, "docs")
PAGES = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(DOCS, "**", "*.md"),
                                                              recursive=True))
MEASUREMENTS = [p for p in PAGES if os.path.dirname(p) == os.path.join(DOCS, "measurements")]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"`[^`]*`")
REPO_PATH = re.compile(r"^(?:nnabla_torus|examples|tools|tests|docs)/[\w./-]*$")


def prose_lines(path):
    """The lines of a markdown file outside fenced code blocks."""
    fenced = False
    for line in open(path, encoding="utf-8"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            yield line.rstrip("\n")


def anchors(path):
    """GitHub's anchors for the headings of a markdown file."""
    seen, found = {}, set()
    for line in prose_lines(path):
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            slug = re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def links(path):
    """The link targets of a markdown file (outside code)."""
    for line in prose_lines(path):
        yield from LINK.findall(INLINE_CODE.sub("", line))


def page_id(path):
    return os.path.relpath(path, ROOT)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_relative_links_and_anchors_resolve(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target):          # https:, mailto: (not checked offline)
            continue
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(full):
            broken.append(f"{target}: no file {os.path.relpath(full, ROOT)}")
        elif anchor and full.endswith(".md") and anchor not in anchors(full):
            broken.append(f"{target}: no heading with anchor #{anchor} in "
                          f"{os.path.relpath(full, ROOT)}")
    assert not broken, f"{page_id(page)}:\n" + "\n".join(broken)


def test_every_docs_page_is_listed_in_the_index():
    index = os.path.join(DOCS, "index.md")
    listed = {os.path.normpath(os.path.join(DOCS, t.partition("#")[0])) for t in links(index)}
    pages = {p for p in PAGES if p.startswith(DOCS) and p != index}
    assert not pages - listed, f"pages missing from docs/index.md: {sorted(pages - listed)}"


# Users' pages say one thing a sentence (measurement pages may hold longer records).
MAX_WORDS = 35
SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[:;])\s+(?=[A-Z(`*-])")
LIST_ITEM = re.compile(r"^\s*(?:[-*]|\d+\.)\s")


def paragraphs(path):
    """The prose paragraphs of a markdown file, list items apart; tables, headings and
    indented blocks left out, inline code as one word, links as their text."""
    lines = []
    for line in list(prose_lines(path)) + [""]:
        other = line.startswith(("#", "    ")) or line.lstrip().startswith("|")
        if (not line.strip() or other or LIST_ITEM.match(line)) and lines:
            yield re.sub(r"\]\([^)]*\)", "]", INLINE_CODE.sub("CODE", " ".join(lines)))
            lines = []
        if line.strip() and not other:
            lines.append(line.strip())


@pytest.mark.parametrize("page", [p for p in PAGES if p not in MEASUREMENTS], ids=page_id)
def test_sentences_of_users_pages_are_short(page):
    long = [s for text in paragraphs(page) for s in SENTENCE_END.split(text)
            if len(s.split()) >= MAX_WORDS]
    assert not long, (f"{page_id(page)}: {len(long)} sentence(s) of {MAX_WORDS} words or more; "
                      f"split them:\n" + "\n".join(long))


# The line under a measurement page's title: when it was measured and which commits recorded it.
DATED = re.compile(r"^Measured (\d{4}-\d\d-\d\d)(?: to (\d{4}-\d\d-\d\d))?, recorded in "
                   r"(?:commit [0-9a-f]{7,40}|commits [0-9a-f]{7,40} to [0-9a-f]{7,40})\.$")


def test_measurements_have_their_own_pages():
    assert len(MEASUREMENTS) >= 2, "docs/measurements/ holds the measured figures"


@pytest.mark.parametrize("page", MEASUREMENTS, ids=page_id)
def test_a_measurement_page_is_headed_by_its_dates_and_commits(page):
    lines = list(prose_lines(page))
    assert lines[0].startswith("# ") and lines[1] == "", f"{page_id(page)}: a title, a blank line"
    dated = DATED.match(lines[2])
    assert dated, (f"{page_id(page)}: line 3 must read 'Measured YYYY-MM-DD[ to YYYY-MM-DD], "
                   f"recorded in commit(s) HASH[ to HASH].', not {lines[2]!r}")
    first, last = dated.group(1), dated.group(2) or dated.group(1)
    assert first <= last, f"{page_id(page)}: dates out of order: {lines[2]!r}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_repository_paths_named_in_the_docs_exist(page):
    named = {code.strip("`") for line in prose_lines(page) for code in INLINE_CODE.findall(line)}
    missing = sorted(p for p in named if REPO_PATH.match(p)
                     and not os.path.exists(os.path.join(ROOT, p)))
    assert not missing, f"{page_id(page)} names paths that do not exist: {missing}"


def code_knobs():
    """{environment variable: default (None when decided at run time)} of every knob of the
    communicator's settings object."""
    from nnabla_torus.comm.settings import KNOBS
    return {knob.env: knob.default for knob in KNOBS.values()}


def table_after(path, heading):
    """The cells of each row of the first table after the first line of ``path`` that starts
    with ``heading``."""
    lines = list(prose_lines(path))
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    rows = []
    for line in lines[start:]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    return rows


def readme_knobs():
    """{variable: default cell} of the README's knobs table."""
    return {cells[0].strip("`"): cells[-1].strip("`")
            for cells in table_after(os.path.join(ROOT, "README.md"), "### Knobs")
            if cells[0].startswith("`NNABLA_TORUS_")}


def test_the_readme_knobs_table_has_exactly_the_knobs_the_code_reads():
    table, code = readme_knobs(), code_knobs()
    assert set(table) == set(code), (f"only in the README: {sorted(set(table) - set(code))}; "
                                     f"only in the code: {sorted(set(code) - set(table))}")


def test_the_readme_knobs_table_states_the_code_defaults():
    wrong = []
    for env, default in code_knobs().items():
        cell = readme_knobs()[env]
        if default is None:
            continue                                # described in words (from host names, ...)
        if isinstance(default, bool):
            ok = cell == str(int(default))
        elif isinstance(default, (int, float)):
            ok = float(cell) == default
        else:
            ok = cell == (default or "empty")
        if not ok:
            wrong.append(f"{env}: README {cell!r}, code {default!r}")
    assert not wrong, "\n".join(wrong)


MODULE_PATH = re.compile(r"(?<![\w/.])(?:nnabla_torus/)?"
                         r"((?:comm|planning|launching|sim|cli|testing)/[\w/]+\.py)\b")
SOURCES = PAGES + [p for folder in ("nnabla_torus", "examples", "tools")
                   for p in glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True)]


def test_package_modules_named_in_docs_and_comments_exist():
    """``planning/costmodel.py`` stayed in a comment after it became a package."""
    missing = sorted({f"{os.path.relpath(p, ROOT)}: {m}" for p in SOURCES
                      for m in MODULE_PATH.findall(open(p).read())
                      if not os.path.exists(os.path.join(ROOT, "nnabla_torus", m))})
    assert not missing, missing


def test_one_spelling_of_the_cache_folder():
    """The library and the example cache under ~/.cache/nnabla_torus (the digits set was
    under ~/.cache/nnabla-torus, the docs named both)."""
    other = re.compile(r"\.cache[\"'/, ]+[\"']?nnabla-torus")
    found = sorted(os.path.relpath(p, ROOT) for p in SOURCES if other.search(open(p).read()))
    assert not found, f"~/.cache/nnabla-torus (not nnabla_torus) in {found}"


def test_the_gpu_to_profile_lists_are_the_code_table():
    """The GPU -> profile table (profile_files.GPU_PROFILES) is printed by the help texts from
    the table itself; the docs copy it in two places, checked here (one missed H200)."""
    from nnabla_torus.planning.profile_files import GPU_PROFILES, gpu_profiles_text
    planner = " ".join(prose_lines(os.path.join(DOCS, "planner.md")))
    assert gpu_profiles_text() in " ".join(planner.split()), gpu_profiles_text()
    assert f"`--gpu-model {'|'.join(GPU_PROFILES)}`".replace("|", "\\|") in planner
    guide = " ".join(prose_lines(os.path.join(DOCS, "contributing.md")))
    assert "`GPU_PROFILES` (`nnabla_torus/planning/profile_files.py`)" in " ".join(guide.split())


def test_every_algorithm_is_documented():
    """Each registered algorithm (comm/collectives.py REGISTRY) has a row in the README's
    algorithms table, its name in the NNABLA_TORUS_ALGORITHM row and its formula in
    docs/costmodel.md: step 5 of docs/contributing.md#add-an-all-reduce-algorithm."""
    from nnabla_torus.comm.collectives import REGISTRY
    readme = os.path.join(ROOT, "README.md")
    rows = {re.match(r"`(\w+)`", cells[0]).group(1)
            for cells in table_after(readme, "### Algorithms")[2:]}
    knob = " ".join(cells[1] for cells in table_after(readme, "### Knobs")
                    if cells[0] == "`NNABLA_TORUS_ALGORITHM`")
    formulas = set(re.findall(r"^- `(\w+)`:", open(os.path.join(DOCS, "costmodel.md")).read(),
                              re.M))
    missing = [f"{name}: {where}" for name in REGISTRY for where, named in (
        ("README algorithms table", name in rows), ("README NNABLA_TORUS_ALGORITHM row",
                                                    f"`{name}`" in knob),
        ("docs/costmodel.md formulas", name in formulas)) if not named]
    assert not missing, missing


def test_every_shipped_profile_is_in_the_planner_table():
    """docs/planner.md lists each file of nnabla_torus/planning/profiles/ (step 4 of
    docs/contributing.md#add-a-machine-profile)."""
    from nnabla_torus.planning.profile_files import list_profiles
    rows = {cells[0].strip("`") for cells in
            table_after(os.path.join(DOCS, "planner.md"), "**Shipped profiles**")[2:]}
    assert set(list_profiles()) <= rows, sorted(set(list_profiles()) - rows)
