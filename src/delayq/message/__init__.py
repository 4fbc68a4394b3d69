"""Messages going out: the envelope (headers, encoding, validation), the factory that builds
them, their size limits, bulk planning, and the errors that name a message's fate. Pure."""
