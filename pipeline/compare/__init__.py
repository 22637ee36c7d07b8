"""`tokencredit compare`: the training experiment as a product command.

A design file (TOML: `design`) names a policy, prompt sets, pools, arms, seeds and scoring decodes; `run` holds
the stages (a pool's annotate config, training an arm, scoring a policy) that tokencredit.flows.compare wires into
one folder, resumably, under the pre-registration that `registry` records; `analysis` gives each difference between arms its variance components
and interval; `plan` sizes a design from a pilot's components and measured costs; `report` writes the tables,
the JSON and the plot.
"""
