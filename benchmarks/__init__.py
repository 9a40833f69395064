"""The committed benchmark reports; harness/ holds the code that writes them."""
