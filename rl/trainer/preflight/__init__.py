"""Everything checked before Ray starts (`checks.preflight`): data, model directories and their weights, images,
tokenizers of the models beside the policy, engines' memory and the planner's estimate. May import every package
but `supervised/` and the loop."""
