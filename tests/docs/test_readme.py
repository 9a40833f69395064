"""README.md (issue 54, item 2): its headline table is the one scripts/readme_headline.py renders
from the committed benchmark reports (the style rules of its prose: lint/test_readme_style.py)."""

from __future__ import annotations

import pathlib
from types import ModuleType

from script_modules import SCRIPTS, load_script


def load_headline(root: pathlib.Path) -> ModuleType:
    """scripts/readme_headline.py (`root` is the checkout the suite runs in)."""
    assert root == SCRIPTS.parent
    return load_script("readme_headline")


def test_readme_headline_is_rendered_from_the_committed_reports(repo_root: pathlib.Path) -> None:
    headline = load_headline(repo_root)
    readme = (repo_root / "README.md").read_text(encoding="utf-8")
    assert headline.current(readme) == headline.render(repo_root), (
        "README.md's headline differs from the committed reports: run "
        "python3 scripts/readme_headline.py")


def test_readme_headline_names_the_command_and_both_baselines(repo_root: pathlib.Path) -> None:
    headline = load_headline(repo_root)
    block = headline.render(repo_root)
    assert "`CNN_RATE=1gbit TRANSFORMER_RATE=1gbit scripts/bench_overlap.sh`" in block
    commands = headline.real_commands(repo_root)
    assert commands and all(f"`{command}`" in block for command in commands)
    # The real models first (issue 55, item 5), each with both baselines and auto, and each row
    # naming the job report that gives its command.
    assert (block.index("ResNet-50") < block.index("VGG-16") < block.index("BERT-base")
            < block.index("GPT-2") < block.index("| CNN |"))
    for name in ("`hvd`", "DDP", "fastest synchronous policy", "commsched `auto"):
        assert block.count(name) >= 6, name
    assert block.count("fastest overlap policy") == 4
    real_rows = [line for line in block.splitlines() if line.startswith("| ") and "](" in line]
    assert len(real_rows) == 20
    for line in real_rows:
        report = line.rsplit("](", 1)[1].split(")", 1)[0]
        assert (repo_root / report).is_file(), report


def test_readme_headline_splices_between_the_markers(repo_root: pathlib.Path) -> None:
    headline = load_headline(repo_root)
    text = f"before\n{headline.BEGIN}\nold table\n{headline.END}\nafter\n"
    spliced = headline.splice(text, "new table\n")
    assert spliced == f"before\n{headline.BEGIN}\nnew table\n{headline.END}\nafter\n"
    assert headline.current(spliced) == "new table\n"


def test_headline_lists_only_the_commands_of_its_reports(tmp_path: pathlib.Path) -> None:
    """A run moved aside (another link, another rank count) keeps its line in commands.txt but
    leaves the headline's list: the list says how the shown numbers were made."""
    headline = load_headline(pathlib.Path(__file__).resolve().parents[2])
    rates = " ".join(f"{pathlib.PurePosixPath(folder).name.upper()}_RATE={link}"
                     for _, folder, link in headline.REAL)
    shown = f"MODELS='resnet50 bert' JOBS='all' RANKS=2 {rates} scripts/bench_real.sh"
    gpt2_link = dict((folder, link) for _, folder, link in headline.REAL)["benchmarks/real/gpt2"]
    elsewhere = shown.replace(f"GPT2_RATE={gpt2_link}", "GPT2_RATE=1mbit")
    moved = elsewhere.replace("'resnet50 bert'", "'gpt2'")
    three = shown.replace("RANKS=2", "RANKS=3")
    path = tmp_path / headline.REAL_COMMANDS
    path.parent.mkdir(parents=True)
    path.write_text("\n".join([moved, shown, three, elsewhere, ""]), encoding="utf-8")
    assert headline.real_commands(tmp_path) == [shown, elsewhere]
