"""What a run reports: the tracker and its journal, the start and end summaries, late metrics, peak FLOPs, the
profiler."""
