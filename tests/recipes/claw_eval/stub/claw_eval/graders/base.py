class AbstractGrader:
    def grade(self, messages, dispatches, task, audit_data=None, judge=None, media_events=None, env_snapshot=None):
        raise NotImplementedError

    @staticmethod
    def _get_final_assistant_text(messages):
        for m in reversed(messages):
            if m.message.role == "assistant":
                return m.message.text
        return ""

    @staticmethod
    def get_service_actions(audit_data, service, action_key):
        found = (audit_data or {}).get(service, {}).get(action_key, [])
        return found if isinstance(found, list) else []
