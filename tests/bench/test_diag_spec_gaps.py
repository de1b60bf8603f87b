"""benchmarks/scripts/diag_spec_gaps.py on the CPU (bench e2e's tiny widening): a request's row reports its whole
time and the wall times of the steps its steady figures leave out (the prefill step and the first, the last two),
which together fit inside the request."""

from helpers.bench_scripts import load_bench_script


def test_a_row_reports_the_request_and_its_edge_steps(tmp_path):
    diag = load_bench_script("diag_spec_gaps")
    row = diag.diagnose("deepseek", "mtp", tmp_path, max_tokens=24, tiny=True)
    edges = row["edge_steps_ms"]
    assert len(edges) == 4 and all(ms > 0 for ms in edges)
    assert row["steps"] >= 6 and sum(edges) + row["median_step_ms"] < row["request_ms"]
