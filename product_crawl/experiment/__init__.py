"""The experiment of the paper's section 3: dynamic scheduling against its baselines, on the simulated web.

``scrapy experiment`` (docs/experiment.md) runs each configuration in turn on a fresh local cluster
(:mod:`.runner`), turns the samples into metrics (:mod:`.summary`) and writes ``summary.json``, the plots and
``report.html`` (:mod:`.report`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from product_crawl.experiment.runner import (
    CONFIGURATIONS,
    DEFAULT_CONFIGURATIONS,
    ExperimentError,
    Options,
    Progress,
    corpus_totals,
    make_options,
    run_configuration,
)

__all__ = ["CONFIGURATIONS", "DEFAULT_CONFIGURATIONS", "ExperimentError", "Options", "make_options",
           "run_experiment"]


def run_experiment(opts: Options, *, redis_url: str, mongo_uri: str, progress: Progress | None = None
                   ) -> tuple[dict[str, Any], Path]:
    """Run every configuration of ``opts``; write summary.json, the plots and report.html into ``opts.out``.

    Returns the summary and the report's path. The raw samples of each run are kept in ``raw/<name>.json``.
    """
    from product_crawl.experiment.report import write_html, write_plots
    from product_crawl.experiment.summary import summarize

    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "raw").mkdir(exist_ok=True)
    totals = corpus_totals(opts.profile, opts.sites, opts.seed)
    raws: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(opts.configurations, 1):
        raw = run_configuration(name, opts, redis_url=redis_url, mongo_uri=mongo_uri, progress=progress,
                                label=f"{name} {i}/{len(opts.configurations)}")
        raws[name] = raw
        (opts.out / "raw" / f"{name}.json").write_text(json.dumps(raw, ensure_ascii=False), encoding="utf-8")
    summary = summarize(raws, opts, totals)
    (opts.out / "summary.json").write_text(json.dumps(summary, ensure_ascii=False, indent=1), encoding="utf-8")
    images = write_plots(summary, opts.out)
    return summary, write_html(summary, opts.out, images)
