"""benchmarks.side_by_side: the probes' summaries share the benchmark's one committed JSON."""

import json

from benchmarks import side_by_side as summaries  # the summary API lives there


def test_a_save_replaces_its_own_section_and_keeps_the_rest_without_each_runs_figures(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"rows": [1, 2], "probes": {"b": {"old": 1}, "a": {"kept": 2}}}))
    runs = {"x": [{"items_per_s": 10.0}, {"items_per_s": 12.0}]}
    summaries.save("b", {"medians": {"x": {"items_per_s": 11.0, "runs": 2}}, "runs": runs}, path)
    saved = json.loads(path.read_text())
    assert saved["rows"] == [1, 2], "the benchmark's own summary stays"
    assert list(saved["probes"]) == ["a", "b"] and saved["probes"]["a"] == {"kept": 2}
    section = saved["probes"]["b"]
    assert section["medians"] == {"x": {"items_per_s": 11.0, "runs": 2}}, "a count of runs stays"
    assert "runs" not in section and "old" not in section
    assert section["command"].startswith("python ")
    assert not list(tmp_path.glob("*.tmp")), "written through a temporary file, then replaced"


def test_the_first_save_makes_the_file(tmp_path):
    path = tmp_path / "summary.json"
    summaries.save("p", {"medians": {}}, path)
    assert summaries.saved(path) == {"p": {"command": summaries.command(), "medians": {}}}
