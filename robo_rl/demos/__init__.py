"""Demonstrations made with the simulator: scripted experts, their rollouts, raw robosuite demos replayed."""
