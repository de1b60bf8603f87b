"""What several test modules share: reference models, harnesses, statistics."""
