"""The main job trains a classifier to a useful accuracy."""

from tracker_gpu.train import train


def test_the_main_job_learns_the_spirals():
    _, accuracy = train(steps=1000, seed=0, log=lambda line: None)
    assert accuracy >= 0.9
