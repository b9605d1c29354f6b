"""Executors: the effectful side. They carry out rankcore's commands and turn
what happens (in a simulator, or on a Ray cluster) into rankcore events."""
