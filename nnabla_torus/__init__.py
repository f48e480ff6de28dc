"""nnabla-torus: 2D-torus all-reduce and batch-size planning for nnabla."""
