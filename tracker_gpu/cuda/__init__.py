"""Fused CUDA pullbacks: the kernel sources, how they are launched (CuPy on a GPU, or a host
build of the same source text for checking them without one), and the rules' fast paths.

Importing this package never imports CuPy.
"""
