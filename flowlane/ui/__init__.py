"""``flowlane ui``: a local web console for flows, runs, queues and workers."""
