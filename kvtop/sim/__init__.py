"""A simulated vLLM V1 server: paged KV cache, scheduler, workloads, faults and `/metrics`.

Modules (imported directly, so that `kvtop` itself does not pay for aiohttp):

* `blocks`      block pool and per-request block tables with vLLM V1's accounting
* `engine`      `Engine`, `EngineConfig`, `StepCost`, `RequestSpec`: the scheduler and clock
* `stats`       counters and histograms with vLLM 0.33's buckets
* `workloads`   `synthetic`, `mooncake`, `azure`, `make_workload`, `trace_path`
* `faults`      `Fault`, `plan`: leak, restart, stall, slow/hanging/malformed /metrics, 401
* `simulation`  `Simulation` (engine + workload + faults, no HTTP) and its `Truth`
* `exposition`  `render`: vLLM 0.33 (v1), vLLM 0.7 (v0) or SGLang names
* `server`      `SimConfig`, `SimServer`, `SimFleet`: servers on 127.0.0.1
* `cli`         `add_sim_parser`, `run_sim`: the `kvtop sim` command
"""
