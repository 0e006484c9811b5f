"""Application services: what the commands do, composed from the compiler, the SQL Core and the runtime.

``deploy`` (plan, apply, verify), ``fleet`` (deployments, queues, rollouts),
``console`` (the read queries and operator actions behind ``flowlane ui``),
``demo`` (the whole loop on the embedded database) and ``scaffold``
(``flowlane init``). The CLI and the web console call these; nothing below
(compiler, core, runtime) imports them.
"""
