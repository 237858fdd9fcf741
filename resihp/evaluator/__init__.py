"""The one evaluator of a Program: its DAG (`dag`), evaluated with given costs (`pipeline`) or
with the analytical cost model (`predict`, the ITP). Torch-free; imports only `core` and `cost`,
so the scheduler (which ranks candidate plans by it) and the simulator (which runs policies) both
sit above it."""
