"""The inputs as data and the rules over them: a cell, a plan and a cell's result, the rules that refuse
a cell, GPU archs, the torch/CUDA/Python tables, recipes, job and runner sizing. Pure: no engine, no
writes."""
