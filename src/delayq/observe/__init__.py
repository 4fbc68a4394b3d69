"""What delayq reports: delivery observers (``deliveries``), publish observers
(``publishes``), a consumer's counters (``stats``), Prometheus metrics (``metrics``),
log context (``logs``) and delivery records for analytics (``records``). Pure."""
