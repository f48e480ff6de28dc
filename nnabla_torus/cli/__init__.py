"""Command-line front ends: ``plan`` is ``nnabla-torus-plan`` (``plan_knobs``, its flags;
``plan_output``, what it shows of a plan; ``plan_recipe``, its ``--recipe`` part). The elastic
launcher ``nnabla-torus-run`` lives with the other launchers, in
:mod:`nnabla_torus.launching.elastic`."""
