"""Episodes over several turns: the user's environments (`row_environments`, `env_calls`, `turns`) and agents
(`agents`, with the OpenAI-compatible endpoint they call and the calls it records), chosen by `episodes`. May
import `rollout/` and the packages below it."""
