"""A run's results as values: what `vmrun report`, `vmrun plot` and `status --json` show.

Runs are read from their folders here (`results/<run-id>/`, as `fetch` and `train --local`
leave them), so reports and plots work after the VMs are gone. Nothing here connects.

- `record`:   a run's run.json, any form any vmrun wrote, as one typed `RunRecord`;
- `layout`:   a run's shape (nodes, processes, world size) from its record, as `RunLayout`;
- `history`:  a results folder as a `RunHistory` (`load_run`, `load_runs`, `run_dirs`);
- `report`:   one row per run, speed-up and efficiency (`report_rows`, `render_markdown`,
              `rows_json`);
- `provenance`: a run's code, variables, and per node its environment, hardware and Slurm
              allocation (`load_provenance`);
- `rundiff`:  what differs between two runs (`diff_runs`, `render_text`);
- `failure`:  which torchrun worker failed first, with its own code (`WorkerFailure`, from a
              record's failure.json);
- `plotting`: a metric's series per run, labels, and `save_plot` (matplotlib, imported only
              there).
"""
