"""Model code and adapters, one family per subpackage (`llamagen`, ...). Decoders reach them only through adapters."""
