"""The series on a pin: one pin, many pins, the index apply, the trees and checkouts, ``--into``, staged writes."""
