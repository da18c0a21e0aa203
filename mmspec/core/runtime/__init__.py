"""How decodings run and are timed, apart from what they compute: captured steps and CUDA graphs (`capture`), the
device flags (`devices`) and the measurements `decoding="auto"` relies on (`measured`)."""
