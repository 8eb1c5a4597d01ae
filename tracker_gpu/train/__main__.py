"""`python -m tracker_gpu.train`: the main job's command line."""

from .cli import main

main()
