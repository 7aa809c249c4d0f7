"""A product plugin package outside dasflow (the ``counts`` test product)."""
