"""Launch: a run directory -> supervised processes. Knows nothing about placements: it starts the plan's
`ProcessSpec`s in order with the readiness checks the plan gave, restarts the ones the plan says are replaceable,
and tears them all down together (`supervisor`); the console shows its events (`display`); what must hold before
anything starts is checked first (`preflight`). It reads and writes the run directory through `contracts.rundir`.
"""
