from django.contrib import admin

from controlplane.applications.models import Application


@admin.register(Application)
class ApplicationAdmin(admin.ModelAdmin):
    list_display = ["name", "store_namespace", "max_parallelism", "created_at"]
    search_fields = ["name", "store_namespace"]
    readonly_fields = ["created_at"]
