"""The schedule index (issue 51, being built): what delayq scheduled and where each
message is. ``entry``: an entry and its states (pure); ``query``: the filter and page
order every store answers alike; ``base``: the store protocol; ``memory`` and
``sqlite``: stores."""
