"""The inputs as data and the rules over them: GPU archs, the torch/CUDA/Python tables, recipes,
job sizing. Pure: no engine, no writes."""
