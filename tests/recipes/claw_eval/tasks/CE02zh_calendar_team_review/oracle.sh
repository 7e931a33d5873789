# the scripted solution orchard's oracle policy runs (not part of Claw-Eval's format)
calendar calendar_list_events --date 2026-03-12
calendar calendar_create_event --title 季度评审 --start_time 2026-03-12T14:00 --end_time 2026-03-12T15:00 --attendees '["wangfang@company.com"]'
claw answer '已安排：3月12日14:00-15:00 季度评审，已邀请王芳。'
