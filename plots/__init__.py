"""Analysis scripts: run folders in, the paper's figures and tables out.

    python plots/paper.py results/runs --out results/paper

Modules:
- load.py    reads run folders (config.yaml, steps.jsonl, evals.jsonl, summary.json) into `Run`
             records, groups seed replicas into settings (`Group`) and comparable settings into
             contexts (`Context`), and answers "when was the target first reached";
- stats.py   estimates (mean or IQM, bootstrap 95% CI) and comparisons (CI of a difference or ratio,
             probability of improvement, verdict; censored times to target) over seed replicas;
- merit.py   a setting's figures of merit and its verdicts against a baseline;
- tables.py  the paper's tables (communication savings, static compression, multi-level);
- figures.py the paper's figures (cumulative floats, gains, chosen CF, time to accuracy);
- bench.py   reads the compression micro-benchmark CSV (direct vs multi-level);
- output.py  atomic writing of figures/tables and the index of what was made;
- paper.py   the command line.

Conventions every output follows (also written into the output's README.md):
- "reaching the target" means the first evaluation whose metric is at least the target (at most,
  for perplexity). Floats, wire bytes and times to target are the cumulative sums of the per-step
  records over the steps done at that evaluation (no interpolation between evaluations: the run
  only knows it reached the target when it evaluated). This equals summary.json's target_reached.
- wall time = Σ step_wall_s (compute + compression + measured communication), modelled time =
  Σ step_model_s (compute + compression + alpha-beta communication); evaluation time excluded.
- runs whose resolved config differs only in seeds (train.seed, dataset.seed), paths, logging or
  options the method ignores are replicas of one setting: figures show their mean with a shaded
  95% confidence band, tables the mean [95% CI] (stats.py) and verdicts against Dense and the
  reference setting (merit.py); to-target figures over the replicas that reached the target.
"""
