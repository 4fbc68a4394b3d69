"""The topology: what is declared on the broker and where a delay goes.

``model`` (:class:`~delayq.Topology`, loading ``topology.yaml``), ``ladder`` (tiers),
``cascade`` (the exact strategy's binary cascade), ``route`` (the one :class:`Router`
every delay goes through), ``declarations`` and ``definitions`` (what ``apply`` declares;
RabbitMQ definitions), ``report`` (the outcome of an apply), ``marker`` (the record that
an apply completed), ``conflicts`` (reading the broker's refusals), ``topic`` (topic
matching), ``fit`` (a ladder fitted to observed delays). Pure: no broker client.
"""
