"""Where a pin's code comes from: the pins, the package index and its listing, the pristine tree."""
