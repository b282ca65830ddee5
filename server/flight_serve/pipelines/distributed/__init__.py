"""Running a pipeline past one process: the same graph nodes, partitioned by key (issue 16).

* :mod:`.keygroups`: key -> key group -> instance (Flink's scheme, stable hashes);
* :mod:`.workers`: the source and window workers and the keyed exchange between them, with no
  cluster (:func:`~.workers.run_local` runs them in this process);
* :mod:`.ray_runtime`: the workers as Ray actors (``flight-serve run --runtime ray``); Ray is
  imported there only, lazily (the ``flight-serve[ray]`` extra).
"""
