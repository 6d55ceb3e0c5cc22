"""LangChain integration: ``RelayChatModel`` (a BaseChatModel over the relay engine)."""

from .chat_model import SWITCH_EVENT, RelayChatModel
from .messages import convert_messages

__all__ = ["SWITCH_EVENT", "RelayChatModel", "convert_messages"]
