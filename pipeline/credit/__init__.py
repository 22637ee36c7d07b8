"""The credit stage: GRPO/GDPO advantages, MRTPO's replay and relevance, P2T (method.md sections 1-3)."""
