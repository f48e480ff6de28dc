"""Planning: the cost model, machine profiles, the planner, batch and learning-rate control."""
