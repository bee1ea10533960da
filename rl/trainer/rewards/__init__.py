"""Scoring responses: the user's reward functions in processes of their own (`rewarding`, `reward_pool`,
`reward_worker`) and the reward models and judges in Ray actors (`reward_models`). May import `state/`."""
