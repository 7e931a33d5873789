"""What a run leaves: trajectories and their files, summaries, pass@k, training exports."""
