"""The training side's processes: Ray's start and stop, where every actor goes (`placement`), the training workers'
start and group, the lifeline that ends them with the driver, and waiting on actors with a deadline. May import
`rewards/` and `state/`."""
