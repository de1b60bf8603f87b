"""Model families, one file each, built from outpace.layers and outpace.attention."""
