"""benchmarks/bench_ranks.py prints plain ratios: the retired 10x / 1000x targets are not judged."""

from __future__ import annotations

from tests.helpers import load_benchmark


def _bench():
    return load_benchmark("bench_ranks")


def test_with_ray_figures_it_prints_ratios_and_no_target_verdicts(capsys, monkeypatch, tmp_path):
    """Ray Serve's rank code stands in as rankcore run twice (the path with Ray's
    figures is the one that printed the verdicts)."""
    bench = _bench()

    def fake_ray(inp, mod):
        out = bench.run_ours(dict(inp))
        out.pop("w4_items", None)
        return out

    monkeypatch.setattr(bench, "_load_ray", lambda: (None, None, "fake"))
    monkeypatch.setattr(bench, "run_ray", fake_ray)
    assert bench.main(["--sizes", "64", "--json", str(tmp_path / "out.json")]) == 0
    out = capsys.readouterr().out
    assert "Summary (speed-up = ray seconds / ours seconds)" in out
    assert "N=     64: W1 " in out and "x, W2 " in out  # the ratios are there
    assert "MET" not in out and "Targets" not in out and "target" not in out.lower()
    assert "targets" not in (tmp_path / "out.json").read_text()
