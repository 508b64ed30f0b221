"""The Snakemake workflow's Python side: configuration, the job plan, and the commands the rules
run (``setdlm data``, ``setdlm train``, ``setdlm profile``).

Modules, in the order a run uses them: ``layout`` (the results layout every stage shares),
``config`` (schema + semantic checks, defaults, hashes), ``plan`` (the jobs a configuration
asks for; the Snakefile's rules read it), ``datasets`` and ``data`` (prepared data with a
manifest), ``train`` (train a tiny family or fetch a published checkpoint), ``points`` (guards
around one evaluation result), ``models`` (models.yaml from the zoo table), ``profile``.

Nothing here imports torch at module level: the Snakefile imports ``plan`` every time the DAG is
built, and on a cluster every job builds it again.
"""
