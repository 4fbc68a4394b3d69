"""delayq under the task frameworks users already run: their delayed sends and their
retries wait in delayq's tiers on the broker, not in a worker's memory or one FIFO
delay queue.

- :mod:`delayq.integrations.dramatiq`: ``DelayqBroker``, a Dramatiq ``RabbitmqBroker``
  (``pip install 'delayq[dramatiq]'``).
- :mod:`delayq.integrations.taskiq`: ``DelayqBroker``, a taskiq-aio-pika
  ``AioPikaBroker`` (``pip install 'delayq[taskiq]'``).

Each binds the framework's own queues to ``<ns>.ready`` (destinations ``existing:
true``, :func:`framework_topology`) and never declares them: the framework does.
"""
